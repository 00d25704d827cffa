"""What portable numerics cost: training SPS with SUITE_NUMERICS=portable against native, side by side.

    python -m benchmarks.speed.numerics_cost
    python -m benchmarks.speed.numerics_cost --repeats 5 --steps 20480 --out results/tables/numerics_cost.md

The kernel mode is fixed when numpy and torch load, so every measured run is a child process started in its
mode; runs alternate (native, portable, native, ...) so that machine noise hits both alike, and the ratio of
median SPS is printed per case. SPS = env steps / (rollout + update time), as in benchmarks.speed.throughput.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

import pandas as pd

from benchmarks import numerics
from benchmarks.speed.throughput import (
    benchmark_config,
    ours_sps,
    parse_timing_args,
    print_table,
    write_timing_table,
)

# case name -> (env, algo, backend, seeds in one process): the suite's two backends (eager torch, the compiled
# engine) on a classic and a MuJoCo task, and a batch of 8 seeds (benchmarks.speed.seed_throughput), whose every call works on [seeds, rows, 64]
# arrays rather than one seed's - where the kernels' vector width has work to speed up
CASES = {
    "CartPole-torch": ("CartPole", "ppo", "torch", 1),
    "HalfCheetah-torch": ("HalfCheetah", "ppo", "torch", 1),
    "HalfCheetah-compiled": ("HalfCheetah", "ppo", "compiled", 1),
    "CartPole-8seeds": ("CartPole", "ppo", "compiled", 8),
    "HalfCheetah-8seeds": ("HalfCheetah", "ppo", "compiled", 8),
}


def child_sps(case: str, steps: int) -> dict:
    """Run in the child: one measured training run, and the kernels this process used."""
    import torch

    torch.set_num_threads(1)
    from benchmarks.speed.seed_throughput import batch_sps

    env, algo, backend, seeds = CASES[case]
    if seeds == 1:
        sps = ours_sps(benchmark_config(env, algo, [], steps, backend))
    else:  # all the batch's env steps (steps per seed x seeds) over its training time
        sps, _update_share = batch_sps(env, algo, steps, seeds)
    record = numerics.kernel_record()
    return {"sps": sps, "torch": record["torch_cpu_capability"], "openblas": record["openblas_core"]}


def measure(case: str, mode: str, steps: int) -> dict:
    child = subprocess.run([sys.executable, "-m", __spec__.name, "--child", case, "--steps", str(steps)],
                           env=numerics.environment_for(mode), capture_output=True, text=True, check=True)
    return json.loads(child.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--steps", type=int, default=20480, help="env steps per measured run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", choices=list(CASES), help=argparse.SUPPRESS)
    args, started, load_before = parse_timing_args(parser, argv)
    if args.child:
        print(json.dumps(child_sps(args.child, args.steps)))
        return
    rows = []
    for case in args.cases:
        samples: dict[str, list[dict]] = {"native": [], "portable": []}
        for _ in range(args.repeats):
            for mode in samples:
                samples[mode].append(measure(case, mode, args.steps))
        medians = {mode: statistics.median(s["sps"] for s in runs) for mode, runs in samples.items()}
        for mode, runs in samples.items():
            rows.append({"case": case, "numerics": mode, "torch kernels": runs[0]["torch"],
                         "OpenBLAS core": runs[0]["openblas"], "median_sps": round(medians[mode]),
                         "runs": " ".join(f"{s['sps']:.0f}" for s in runs),
                         "vs_native": round(medians[mode] / medians["native"], 3)})
        print(pd.DataFrame([r for r in rows if r["case"] == case]).to_string(index=False), flush=True)
    table = print_table(rows, f"steps per run: {args.steps}, repeats: {args.repeats}, torch threads: 1, "
                              "one child process per run")
    if args.out:
        write_timing_table(
            args.out, "Cost of portable numerics", __spec__.name, argv, started, load_before,
            "the runs themselves load one core", "SPS = env steps / (rollout + update time), one child process "
            "per run in its kernel mode, modes alternating; `vs_native` = median SPS relative to native kernels; "
            "`-8seeds`: 8 seeds in one process (`seeds=[0,...,7]`), SPS summed over the seeds.",
            table, kernels_of_this_process=False)


if __name__ == "__main__":
    main()
