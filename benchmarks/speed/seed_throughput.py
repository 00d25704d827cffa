"""Aggregate training throughput of N seeds in one process (seeds=[...]) against one seed alone.

    python -m benchmarks.speed.seed_throughput                                   # HalfCheetah and CartPole, N = 1..16
    python -m benchmarks.speed.seed_throughput --envs HalfCheetah --sizes 1 8 --steps 8192 --repeats 1
    python -m benchmarks.speed.seed_throughput --two-processes 8                 # + two batches of 8 on two cores

Measured in one run, side by side, on one core (torch threads 1):
- the raw env: one Gymnasium env of the task stepped with random actions (the ceiling);
- one seed alone (`seed=`, the default engine: a compiled population of one), the reference of `x_one_seed`;
- a population of N seeds (N = --sizes; PPO's torch loss over a seed axis, compiled: algorithms/population.py);
  aggregate SPS = N x steps / (rollout + update time);
- with --two-processes N: two batches of N as two processes at once (both cores), their summed SPS.
Evaluation, start-up and checkpoints are excluded from the timed part, as in benchmarks.speed.throughput, and so is
every run's first iteration (where the compiled backend compiles; 10-30 s cold, a few seconds from the cache).
Each configuration is measured --repeats times in turn (1, N1, N2, ..., 1, N1, ...) and the median kept.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import pandas as pd

from benchmarks.engine.batch_trainer import train_batch
from benchmarks.speed.throughput import benchmark_config, parse_timing_args, print_table, timed_sps, write_timing_table
from benchmarks.engine.trainer import train
from benchmarks.arguments import conf_name


def single_sps(env: str, algo: str, steps: int, recipe: bool = True) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as root:
        train(benchmark_config(env, algo, [], steps, "compiled", recipe), Path(root))
        return timed_sps([Path(root)])


def batch_sps(env: str, algo: str, steps: int, size: int, recipe: bool = True) -> tuple[float, float]:
    cfg = benchmark_config(env, algo, [f"seeds={list(range(size))}"], steps, "compiled", recipe)
    with tempfile.TemporaryDirectory() as root:
        run_dirs = [Path(root) / f"seed{seed}" for seed in range(size)]
        train_batch(cfg, run_dirs)
        return timed_sps(run_dirs)


def raw_env_sps(env: str, steps: int) -> float:
    """One env of the task (gymnasium.make, its default wrappers) stepped with random actions."""
    from benchmarks.engine.config import compose_config

    env_id = compose_config([f"env={env}"]).env.id
    single = gym.make(env_id)
    single.reset(seed=0)
    single.action_space.seed(0)
    actions = [single.action_space.sample() for _ in range(steps)]
    start = time.perf_counter()
    for action in actions:
        _, _, terminated, truncated, _ = single.step(action)
        if terminated or truncated:
            single.reset()
    elapsed = time.perf_counter() - start
    single.close()
    return steps / elapsed


def two_processes_sps(env: str, algo: str, steps: int, size: int) -> float:
    """Two batches of `size` seeds as two processes started together; their summed SPS."""
    code = ("import sys; from benchmarks.speed.seed_throughput import batch_sps; "
            f"print(batch_sps({env!r}, {algo!r}, {steps}, {size})[0])")
    processes = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"}) for _ in range(2)]
    return sum(float(process.communicate()[0].strip().splitlines()[-1]) for process in processes), float("nan")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", nargs="+", default=["HalfCheetah", "CartPole"], type=conf_name("env"))
    parser.add_argument("--algo", default="ppo", type=conf_name("algo"))
    parser.add_argument("--sizes", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    parser.add_argument("--values", choices=["recipe", "tuned"], default="recipe",
                        help="recipe: CleanRL's values (the speed tools' default); tuned: the tuned defaults")
    parser.add_argument("--steps", type=int, default=8192, help="env steps per seed per measured run")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--two-processes", type=int, metavar="N", help="also two batches of N on two cores")
    args, started, load_before = parse_timing_args(parser, argv)

    recipe = args.values == "recipe"
    rows = []
    for env in args.envs:
        samples: dict[str, list] = {}
        for _ in range(args.repeats):
            samples.setdefault("raw env (random actions)", []).append((raw_env_sps(env, args.steps), float("nan")))
            samples.setdefault("one seed alone", []).append(single_sps(env, args.algo, args.steps, recipe))
            for size in args.sizes:
                samples.setdefault(f"population of {size}", []).append(
                    batch_sps(env, args.algo, args.steps, size, recipe))
            if args.two_processes:
                samples.setdefault(f"2 processes x batch of {args.two_processes}", []).append(
                    two_processes_sps(env, args.algo, args.steps, args.two_processes))
        medians = {name: statistics.median(sps for sps, _ in values) for name, values in samples.items()}
        alone, raw = medians["one seed alone"], medians["raw env (random actions)"]
        for name, values in samples.items():
            rows.append({"env": env, "what": name, "median_sps": round(medians[name]),
                         "runs": " ".join(f"{sps:.0f}" for sps, _ in values),
                         "x_one_seed": round(medians[name] / alone, 2),
                         "fraction_of_raw_env": round(medians[name] / raw, 2),
                         "update_share": round(statistics.median(share for _, share in values), 2)})
        print(pd.DataFrame([r for r in rows if r["env"] == env]).to_string(index=False), flush=True)
    table = print_table(rows, f"algo {args.algo} ({'CleanRL' if recipe else 'the tuned'} values), {args.steps} env "
                              f"steps per seed per run, repeats {args.repeats}, torch threads 1")
    if args.out:
        write_timing_table(
            args.out, "Many seeds in one process: aggregate throughput", "benchmarks.speed.seed_throughput",
            argv, started, load_before, None, "SPS = env steps of all seeds / (rollout + update time), one core "
            "unless stated, each run's first iteration left out (it compiles); `x_one_seed` = against one seed alone "
            "(seed=, a population of one), `fraction_of_raw_env` = against one Gymnasium env of the task stepped with "
            "random actions, both measured in the same run; `update_share` = the update's share of the training time "
            "(the rest: acting, env steps, statistics).", table)


if __name__ == "__main__":
    main()
