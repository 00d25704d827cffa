"""Where the compiled minibatch step's time goes, per seed: how the program's time in kernels splits between the
matrix products (MKL's, which the program calls) and the kernels the compiler generated (every elementwise
operation and reduction of the loss, its gradient and Adam, the networks' tanh among them); and tanh alone, on as
many numbers as the step's forward passes through it (eager torch.tanh: the same vectorized function the generated
kernels call), against the whole step.

    python -m benchmarks.speed.step_kernels --out results/tables/step_kernels.md

PPO's program as benchmarks.speed.population_step builds it (the recipe's values, a synthetic minibatch, one
thread). The step is timed over --calls calls as a run compiles it; the split is read from the same program
compiled again with inductor's kernel profiling on (torch.profiler then records each generated kernel; the
recording adds to each kernel's time, so only the split is read from it). Medians of --repeats.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from benchmarks.speed.population_step import SHAPES, add_case_arguments, microseconds, population_and_step
from benchmarks.speed.throughput import parse_timing_args, print_table, write_timing_table

# the profiler's names of the program's calls into aten's matrix products (cpp_wrapper programs call aoti_torch_*)
PRODUCT_CALLS = ("aoti_torch_cpu_bmm_out", "aoti_torch_cpu_mm_out", "aoti_torch_cpu_addmm_out", "aoti_torch_cpu_baddbmm_out",
                 "aten::bmm", "aten::mm", "aten::addmm", "aten::baddbmm")


def kernel_microseconds(events, calls: int) -> tuple[float, float]:
    """(matrix products, generated kernels) in microseconds per call, from the profiler's key averages (self time,
    in microseconds, summed over `calls` calls)."""
    products = sum(event.self_cpu_time_total for event in events if event.key in PRODUCT_CALLS)
    generated = sum(event.self_cpu_time_total for event in events if "cpp_fused" in event.key)
    if products == 0 or generated == 0:  # a split of nothing: the names torch records by are not these
        raise SystemExit(f"error: the profiler recorded no {'matrix products' if products == 0 else 'generated kernels'}"
                         f" under the names this tool reads ({', '.join(PRODUCT_CALLS)}; cpp_fused*)")
    return products / calls, generated / calls


def tanh_numbers(algorithm, rows: int) -> int:
    """How many numbers one seed's forward passes through tanh on a minibatch: every hidden unit of the actor and
    of the critic (PPO's policy: two MLPs of algo.hidden_sizes), for each row."""
    return rows * 2 * sum(algorithm.cfg.hidden_sizes)


def measure(env: str, size: int, calls: int) -> dict[str, float]:
    """Microseconds per seed of one minibatch step and of tanh on its activations, and the products' share of the
    time the program spends in kernels."""
    import torch._inductor.config as inductor

    population, step = population_and_step(env, size, None)
    if population.mode != "compiled":
        raise SystemExit("error: the step compiles only with a C++ compiler, and none was found")
    step()  # compiled here, outside the timed calls
    with population.unchecked_calls():  # as the trainer calls it: guards checked once per block
        whole = microseconds(step, calls)
    # the same program compiled again with each generated kernel recorded (the recording adds to each kernel's
    # time, so only the split between products and generated kernels is read from it)
    with inductor.patch({"cpp.enable_kernel_profile": True}):
        population, step = population_and_step(env, size, None)
        step()
    with population.unchecked_calls(), torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        for _ in range(calls):
            step()
    products, generated = kernel_microseconds(profiler.key_averages(), calls)
    activations = torch.randn(size * tanh_numbers(population.algorithms[0], SHAPES[env][4]))
    out = torch.empty_like(activations)
    tanh = microseconds(lambda: torch.tanh(activations, out=out), calls)
    return {"step": whole / size, "products_share": products / (products + generated), "tanh": tanh / size}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_case_arguments(parser)
    args, started, load_before = parse_timing_args(parser, argv)
    rows = []
    for env in args.envs:
        for size in args.sizes:
            samples = [measure(env, size, args.calls) for _ in range(args.repeats)]
            median = {part: statistics.median(sample[part] for sample in samples) for part in samples[0]}
            rows.append({"env": env, "seeds": size, "step_us_per_seed": round(median["step"], 1),
                         "products_share_of_kernels": f"{median['products_share']:.0%}",
                         "tanh_alone_us_per_seed": round(median["tanh"], 1),
                         "tanh_share_of_step": f"{median['tanh'] / median['step']:.0%}"})
    table = print_table(rows, f"one thread, {args.calls} calls per case, medians of {args.repeats}")
    if args.out:
        write_timing_table(args.out, "Where the compiled minibatch step's time goes", "benchmarks.speed.step_kernels",
                           argv, started, load_before, None,
                           "Microseconds per seed of PPO's compiled minibatch step (loss, gradient, norm clip, Adam; "
                           "the recipe's minibatch, synthetic); `products_share_of_kernels`: the matrix products' "
                           "share (MKL, called by the program) of the time in the program's kernels, the rest "
                           "being the kernels the compiler generated (the other arithmetic, tanh included); "
                           "`tanh_alone_us_per_seed`: eager torch.tanh on as many numbers as the step's forward "
                           "passes through tanh, and its share of the step.",
                           table)


if __name__ == "__main__":
    main()
