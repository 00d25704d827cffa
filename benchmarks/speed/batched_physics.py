"""Batched physics (benchmarks/engine/mujoco_batch.py, classic_batch.py) against Gymnasium's per-env step, side by
side.

    python -m benchmarks.speed.batched_physics [--env HalfCheetah] [--seeds 2 4 8] [--repeats 6] [--train-steps 8192]
        [--out results/tables/batched_physics.md]
    python -m benchmarks.speed.batched_physics --env CartPole --out results/tables/batched_physics_cartpole.md

Env step: the population's env layer (LockstepEnvs, 1 env per seed) stepped with the same random actions,
batched and not, alternated repeat by repeat; us per env step, medians. Training: a population of 8 seeds of
PPO (the task's defaults) for --train-steps each, batched and not, alternated; the env-step phase and the
whole loop in seconds, medians. Both modes train to the same numbers (tests/test_mujoco_batch.py,
tests/test_classic_batch.py). The rows start at 2 seeds.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

from benchmarks.engine.batch_trainer import LockstepEnvs, train_batch
from benchmarks.engine.config import compose_config
from benchmarks.engine.envs import make_vector_env
from benchmarks.arguments import conf_name


def env_step_us(env_id: str, seeds: int, repeats: int, steps: int = 500) -> dict[bool, float]:
    layers = {}
    for batched in (False, True):
        vector_envs = [make_vector_env(env_id, 1, seed=seed) for seed in range(seeds)]
        for seed, envs in enumerate(vector_envs):
            envs.reset(seed=seed)
        layers[batched] = LockstepEnvs(vector_envs, batched_physics=batched)
    space, rng = vector_envs[0].single_action_space, np.random.default_rng(0)
    if isinstance(space, gym.spaces.Discrete):
        actions = rng.integers(0, space.n, (steps, seeds, 1))
    else:
        actions = rng.normal(0.0, 0.3, (steps, seeds, 1, space.shape[0])).astype(np.float32)
    active = np.ones(seeds, dtype=bool)
    times = {False: [], True: []}
    for repeat in range(repeats):
        for batched in ((False, True) if repeat % 2 else (True, False)):
            started = time.perf_counter()
            for t in range(steps):
                layers[batched].step(actions[t], active)
            times[batched].append((time.perf_counter() - started) / steps / seeds * 1e6)
    return {batched: float(np.median(values)) for batched, values in times.items()}


def training_seconds(env: str, steps: int, repeats: int) -> dict[bool, tuple[float, float]]:
    seeds = list(range(8))
    overrides = [f"env={env}", "algo=ppo", f"seeds={seeds}", f"total_steps={steps}", "eval.at_start=false",
                 f"eval.every_steps={10 * steps}", "eval.episodes=1", "logging.progress_bar=false",
                 "logging.tensorboard=false", "logging.checkpoint=false"]
    times = {False: [], True: []}
    for repeat in range(repeats):
        for batched in ((False, True) if repeat % 2 else (True, False)):
            with tempfile.TemporaryDirectory() as root:
                summaries = train_batch(compose_config([*overrides, f"batched_physics={str(batched).lower()}"]),
                                        [Path(root) / f"seed{s}" for s in seeds])
            phases = summaries[0]["phase_seconds"]
            times[batched].append((phases["env step"], sum(phases.values())))
    return {batched: tuple(float(np.median(column)) for column in zip(*values)) for batched, values in times.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="HalfCheetah", type=conf_name("env"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--train-steps", type=int, default=8192, help="per seed; 0 skips the training rows")
    parser.add_argument("--out", type=Path, help="also write the table there, with its command and machine")
    args = parser.parse_args(argv)
    env_id = compose_config([f"env={args.env}"]).env.id
    lines = [f"| {env_id}, one thread | Gymnasium | batched | ratio |", "|:--|--:|--:|--:|"]
    print("\n".join(lines))

    def row(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    for seeds in args.seeds:
        us = env_step_us(env_id, seeds, args.repeats)
        row(f"| env step, {seeds} seeds x 1 env (us per env step) | {us[False]:.1f} | {us[True]:.1f} "
            f"| {us[False] / us[True]:.2f} |")
    if args.train_steps:
        seconds = training_seconds(args.env, args.train_steps, max(2, args.repeats // 2))
        for index, what in enumerate(("env-step phase", "whole loop")):
            row(f"| PPO, 8 seeds x {args.train_steps} steps: {what} (s) | {seconds[False][index]:.2f} "
                f"| {seconds[True][index]:.2f} | {seconds[False][index] / seconds[True][index]:.2f} |")
    if args.out:
        command = " ".join(["python -m benchmarks.speed.batched_physics", *sys.argv[1:]])
        load = os.getloadavg()[0]
        args.out.write_text(f"# Batched physics against Gymnasium's step\n\nMade by `{command}` "
                            f"({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, 1-minute load average "
                            f"{load:.2f} at the end). Medians of alternated repeats; both modes give the same numbers."
                            f"\n\n" + "\n".join(lines) + "\n")

if __name__ == "__main__":
    main()
