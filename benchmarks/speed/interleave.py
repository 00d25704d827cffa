"""What a rollout pays for alternating two bodies of code at every env step: the act program and the env step,
each timed alone (called back to back) and interleaved (act, step, act, step, ... as the rollout calls them).

    python -m benchmarks.speed.interleave --env HalfCheetah
    python -m benchmarks.speed.interleave --env CartPole --seeds 1 8 --out results/tables/interleave_cartpole.md

A population of N seeds of PPO on the task (CleanRL's values, the default engine: compiled, one torch thread): its
act program (`PopulationBatch.act`, every seed's observations in one call) and the loop's env layer
(`LockstepEnvs.step` as a run builds it: Gymnasium's step of every sub-env, or the task's batched physics from the
sub-env count where it gains; the table names which), given the same random actions either way. Each timing is the
run of --steps calls (rounds of both calls, interleaved) with the lowest total of --repeats, after a warm-up of
each, in us per call and per seed (a seed's step is a step of its env.num_envs envs). Neither call does more work
interleaved; what they cost above their cost alone is what switching between them costs the CPU (each leaves the
other's code and data colder in the caches and branch predictors: the likeliest cause, not separated here). A
population pays it once per step for all its seeds.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.arguments import conf_name, number_in
from benchmarks.speed.throughput import benchmark_config, parse_timing_args, print_table, write_timing_table

WARM_UP_ROUNDS = 100


def best_us(calls: list, steps: int, repeats: int) -> list[float]:
    """Of `repeats` runs of `steps` rounds of `calls` (each round calls them in turn, with the round's index), the
    run with the lowest total: each call's own time in it, in us per call."""
    best, best_total = [float("inf")] * len(calls), float("inf")
    for _ in range(repeats):
        spent = [0.0] * len(calls)
        for step in range(steps):
            for index, call in enumerate(calls):
                started = time.perf_counter()
                call(step)
                spent[index] += time.perf_counter() - started
        if sum(spent) < best_total:
            best, best_total = [seconds / steps * 1e6 for seconds in spent], sum(spent)
    return best


def measure(env: str, seeds: int, steps: int, repeats: int) -> tuple[dict[str, float], str, str]:
    """Each call's us per call, alone and interleaved; the act program's mode (compiled, or eager); the env layer."""
    from algorithms.population import PopulationBatch
    from benchmarks.engine.batch_trainer import LockstepEnvs, SeedRun, seed_config

    cfg = benchmark_config(env, "ppo", [f"seeds={list(range(seeds))}"], 1_000_000, "compiled", True)  # no run trains
    with tempfile.TemporaryDirectory() as root:
        runs = [SeedRun(seed_config(cfg, seed), Path(root) / f"seed{seed}", progress_bar=False,
                        own_streams=seeds > 1)  # as train_batch builds them
                for seed in range(seeds)]
        try:
            for run in runs:
                run.start(None)
            population = PopulationBatch([run.algorithm for run in runs], [run.randoms for run in runs])
            envs = LockstepEnvs([run.envs for run in runs], batched_physics=cfg.get("batched_physics"))
            layer = "Gymnasium's step" if envs.physics is None else "batched physics"
            space = envs.sub_envs[0][0].action_space
            space.seed(0)
            rows = WARM_UP_ROUNDS + steps
            actions = np.array([[[space.sample() for _ in envs.sub_envs[0]] for _ in range(seeds)]
                                for _ in range(rows)])
            active = np.ones(seeds, dtype=bool)
            observations = envs.raw_obs.astype(np.float32)

            def act(_step):
                population.act(observations, active)

            def env_step(step):
                envs.step(actions[step], active)

            with population.unchecked_calls():
                best_us([act, lambda step: env_step(steps + step)], WARM_UP_ROUNDS, 1)  # compiles the act program
                act_alone, = best_us([act], steps, repeats)
                step_alone, = best_us([env_step], steps, repeats)
                act_interleaved, step_interleaved = best_us([act, env_step], steps, repeats)
            mode = population.mode
        finally:
            for run in runs:
                run.close()
    times = {"act alone": act_alone, "env step alone": step_alone, "act interleaved": act_interleaved,
             "env step interleaved": step_interleaved}
    return times, mode, layer


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="HalfCheetah", type=conf_name("env"))
    parser.add_argument("--seeds", nargs="+", type=number_in(1, integer=True), default=[1, 8])
    parser.add_argument("--steps", type=number_in(1, integer=True), default=3000, help="calls per timed run")
    parser.add_argument("--repeats", type=number_in(1, integer=True), default=3)
    args, started, load_before = parse_timing_args(parser, argv)
    rows, modes = [], set()
    for seeds in args.seeds:
        times, mode, layer = measure(args.env, seeds, args.steps, args.repeats)
        modes.add(mode)
        alone = times["act alone"] + times["env step alone"]
        interleaved = times["act interleaved"] + times["env step interleaved"]
        for what, us in [*times.items(), ("act + env step alone", alone),
                         ("act + env step interleaved", interleaved),
                         ("switching cost (interleaved - alone)", interleaved - alone)]:
            rows.append({"seeds": seeds, "env layer": layer, "call": what, "us per call": round(us, 1),
                         "us per seed": round(us / seeds, 1)})
    num_envs = benchmark_config(args.env, "ppo", [], 1_000_000, "compiled", True).env.num_envs
    settings = (f"{args.env}, {num_envs} env(s) per seed, PPO with CleanRL's values, act program "
                f"{' and '.join(sorted(modes))}, torch threads 1; of {args.repeats} runs of {args.steps} calls, the "
                f"lowest total")
    table = print_table(rows, settings)
    if args.out:
        write_timing_table(args.out, f"Alternating the act program and the env step: {args.env}", __spec__.name,
                           argv, started, load_before, None,
                           f"{settings}. `alone`: the call back to back; `interleaved`: act, env step, act, ... as a "
                           f"rollout calls them. The switching cost is what the two calls cost above their cost "
                           f"alone; `us per seed` divides a call by the seeds it serves.", table)


if __name__ == "__main__":
    main()
