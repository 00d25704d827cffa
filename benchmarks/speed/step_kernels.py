"""Where the compiled minibatch step's time goes, per seed: the matrix products (MKL's, which the program calls), the
kernels the compiler generated (every elementwise operation and reduction of the loss, its gradient and Adam, the
networks' tanh among them) and the program's own code around them; and tanh's own time on as many numbers as the
step's forward passes through it, compiled as the step compiles it.

    python -m benchmarks.speed.step_kernels --out results/tables/step_kernels.md

PPO's program as benchmarks.speed.population_step builds it (the recipe's values, a synthetic minibatch, one
thread). The step is timed over --calls calls as a run compiles it. The split is read from the same program
compiled again with inductor's kernel profiling on, over another --calls calls under torch.profiler: each product
call and each generated kernel is recorded with its time (and its recording's), the rest of the profiled time is
the program's own code. tanh's own time: a compiled tanh of the numbers less a compiled addition to them (the same
reads and writes, in one generated kernel each). Medians of --repeats.
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


def split(events, calls: int) -> dict[str, float]:
    """The profiler's key averages (self times in microseconds, counts, over `calls` calls of the step) as
    microseconds and counts per call: the matrix products, the generated kernels (inductor's cpp_fused_*), and the
    rest (the program's own code and the calls around it)."""
    parts = {"products": 0.0, "generated": 0.0, "rest": 0.0, "product_calls": 0, "generated_calls": 0}
    for event in events:
        if event.key in PRODUCT_CALLS:
            parts["products"] += event.self_cpu_time_total
            parts["product_calls"] += event.count
        elif "cpp_fused" in event.key:
            parts["generated"] += event.self_cpu_time_total
            parts["generated_calls"] += event.count
        else:
            parts["rest"] += event.self_cpu_time_total
    if parts["products"] == 0 or parts["generated"] == 0:  # a split of nothing: torch records under other names
        raise SystemExit(f"error: the profiler recorded no "
                         f"{'matrix products' if parts['products'] == 0 else 'generated kernels'} under the names this "
                         f"tool reads ({', '.join(PRODUCT_CALLS)}; cpp_fused*)")
    return {key: value / calls for key, value in parts.items()}


def tanh_numbers(algorithm, rows: int) -> int:
    """How many numbers one seed's forward passes through tanh on a minibatch: every hidden unit of the actor and
    of the critic (PPO's policy: two MLPs of algo.hidden_sizes), for each row."""
    return rows * 2 * sum(algorithm.cfg.hidden_sizes)


def own_tanh_microseconds(count: int, calls: int) -> float:
    """tanh's own time on `count` numbers, compiled as the population's programs are: a compiled tanh less a
    compiled addition (the same reads, writes and call)."""
    from algorithms.population import CompiledOnce, compile_mode

    numbers = torch.randn(count)
    tanh, addition = CompiledOnce(torch.tanh, compile_mode()), CompiledOnce(lambda x: x + 1.0, compile_mode())
    return microseconds(lambda: tanh(numbers), calls) - microseconds(lambda: addition(numbers), calls)


def measure(env: str, size: int, calls: int) -> dict[str, float]:
    """Microseconds per seed of one minibatch step, of its parts and of tanh's own time on its activations; the
    parts' calls per step."""
    import torch._inductor.config as inductor

    population, step = population_and_step(env, size, None)
    if population.mode != "compiled":
        raise SystemExit("error: the step compiles only with a C++ compiler, and none was found")
    step()  # compiled here, outside the timed calls
    with population.unchecked_calls():  # as the trainer calls it: guards checked once per block
        step_time = microseconds(step, calls)
    with inductor.patch({"cpp.enable_kernel_profile": True}):  # the same program, its kernels recorded
        population, step = population_and_step(env, size, None)
        step()
    with population.unchecked_calls(), torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        for _ in range(calls):
            step()
    parts = split(profiler.key_averages(), calls)
    profiled = parts["products"] + parts["generated"] + parts["rest"]
    tanh = own_tanh_microseconds(size * tanh_numbers(population.algorithms[0], SHAPES[env][4]), calls)
    return {"step": step_time / size, "tanh": tanh / size, "product_calls": parts["product_calls"],
            "generated_calls": parts["generated_calls"],
            **{f"{part}_share": parts[part] / profiled for part in ("products", "generated", "rest")}}


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
                         "products": f"{median['products_share']:.0%} ({median['product_calls']:.0f} calls)",
                         "generated_kernels": f"{median['generated_share']:.0%} ({median['generated_calls']:.0f} calls)",
                         "rest": f"{median['rest_share']:.0%}",
                         "tanh_own_us_per_seed": round(median["tanh"], 1),
                         "tanh_share_of_step": f"{median['tanh'] / median['step']:.0%}"})
    table = print_table(rows, f"one thread, {args.calls} calls per case, medians of {args.repeats}")
    if args.out:
        write_timing_table(args.out, "Where the compiled minibatch step's time goes", "benchmarks.speed.step_kernels",
                           argv, started, load_before, None,
                           "Microseconds per seed of PPO's compiled minibatch step (loss, gradient, norm clip, Adam; "
                           "the recipe's minibatch, synthetic). Its profiled time split three ways, with each "
                           "part's calls per step: the matrix products (MKL, called by the program), the kernels "
                           "the compiler generated (the other arithmetic, tanh included) and the rest (the "
                           "program's own code and the calls around it); each recorded call's time includes its "
                           "recording's. `tanh_own_us_per_seed`: a compiled tanh of as many numbers as the step's "
                           "forward passes through tanh, less a compiled addition to them; its share is of the "
                           "step.",
                           table)


if __name__ == "__main__":
    main()
