"""What one matrix product of the population's step costs by each route a portable engine could take.

    python -m benchmarks.speed.gemm_routes                                 # this process's numerics mode
    SUITE_NUMERICS=native python -m benchmarks.speed.gemm_routes           # MKL's native branch, for comparison

The products of a 64x64 MLP's minibatch step (64 rows), for one seed and for a population of 8:
    torch bmm        ATen's product: MKL, on its COMPATIBLE branch in portable mode (the same on Intel and AMD)
    compiled loops   the product written as a multiply and a sum, so that the compiler generates it as C++ loops
                     of the pinned vector width (portable by construction)
    numpy OpenBLAS   numpy's matmul: OpenBLAS, pinned to its Haswell kernels in portable mode (the numpy
                     gradient's route)
One torch thread; medians of --repeats timings of --calls calls each, in this one process.
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks import numerics  # noqa: F401  (pins the portable kernels before torch and numpy load)

import numpy as np
import torch


def microseconds(call, calls: int, repeats: int) -> float:
    for _ in range(20):
        call()
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        timings.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(timings)


def products(seeds: int, calls: int, repeats: int) -> dict[str, float]:
    from algorithms.population import pin_code_generator

    pin_code_generator()
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(seeds, 64, 64, generator=generator), torch.randn(seeds, 64, 64, generator=generator)
    loops = torch.compile(lambda x, y: (x[:, :, :, None] * y[:, None, :, :]).sum(dim=-2), dynamic=False)
    a_np, b_np = a.numpy(), b.numpy()
    return {"torch bmm": microseconds(lambda: torch.bmm(a, b), calls, repeats),
            "compiled loops": microseconds(lambda: loops(a, b), calls, repeats),
            "numpy OpenBLAS": microseconds(lambda: np.matmul(a_np, b_np), calls, repeats)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    record = numerics.kernel_record()
    print(f"{numerics.MODE} numerics: torch {record['torch_cpu_capability']}, OpenBLAS {record['openblas_core']}; "
          f"one 64x64 by 64x64 product per seed, us per call (medians of {args.repeats})")
    print(f"{'seeds':>5}  {'torch bmm':>10}  {'compiled loops':>14}  {'numpy OpenBLAS':>14}")
    for seeds in (1, 8):
        cost = products(seeds, args.calls, args.repeats)
        print(f"{seeds:>5}  {cost['torch bmm']:>10.1f}  {cost['compiled loops']:>14.1f}  {cost['numpy OpenBLAS']:>14.1f}")


if __name__ == "__main__":
    main()
