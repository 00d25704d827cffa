"""What one matrix product of the population's step costs by each route a portable engine could take.

    python -m benchmarks.speed.gemm_routes                                 # this process's numerics mode
    SUITE_NUMERICS=native python -m benchmarks.speed.gemm_routes           # MKL's native branch, for comparison
    python -m benchmarks.speed.gemm_routes --out results/tables/gemm_routes.md

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

from benchmarks.speed.throughput import parse_timing_args, print_table, write_timing_table


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
    args, started, load_before = parse_timing_args(parser, argv)
    rows = [{"seeds": seeds, **{f"{route} (us)": round(cost, 1) for route, cost in products(seeds, args.calls,
                                                                                            args.repeats).items()}}
            for seeds in (1, 8)]
    record = numerics.kernel_record()
    table = print_table(rows, f"{numerics.MODE} numerics: torch {record['torch_cpu_capability']}, OpenBLAS "
                              f"{record['openblas_core']}; one 64x64 by 64x64 product per seed, us per call "
                              f"(medians of {args.repeats})")
    if args.out:
        write_timing_table(args.out, "One matrix product of the population's step, by each route", __spec__.name,
                           argv, started, load_before, None,
                           "One 64x64 by 64x64 product per seed, us per call (medians of "
                           f"{args.repeats} timings of {args.calls} calls), one torch thread: torch's `bmm` (MKL), "
                           "the product as a multiply and a sum compiled into loops of the pinned vector width, "
                           "numpy's `matmul` (OpenBLAS).", table)


if __name__ == "__main__":
    main()
