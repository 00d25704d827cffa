"""The cost of one PPO minibatch step and of one act call, per seed: the eager torch update, the population's
program run eager for one seed (no C++ compiler) and compiled for 1 and N seeds (algorithms/population.py).

    python -m benchmarks.speed.population_step                                  # HalfCheetah and CartPole shapes
    python -m benchmarks.speed.population_step --sizes 1 8 16 --out results/tables/population_step.md

One thread, the family's recipe values (CleanRL's minibatch of 64 on HalfCheetah, 128 on CartPole), a synthetic
minibatch; each case is warmed up (compiled) first and then timed over --calls calls; medians of --repeats.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from algorithms import build_algorithm
from algorithms.population import PopulationBatch, PopulationStep, adam_state_from, stack_parameters
from benchmarks.engine.batch_trainer import RandomState
from benchmarks.speed.throughput import benchmark_config, parse_timing_args, print_table, write_timing_table

# task -> (obs dim, action dim, discrete, envs, minibatch rows) under the speed tools' recipe
SHAPES = {"HalfCheetah": (17, 6, False, 1, 64), "CartPole": (4, 2, True, 4, 128)}


def microseconds(call, calls: int) -> float:
    for _ in range(10):
        call()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls * 1e6


def algorithms_for(env: str, backend: str, count: int) -> list:
    obs_dim, action_dim, discrete, _, _ = SHAPES[env]
    cfg = benchmark_config(env, "ppo", [], 2048, backend)
    torch.manual_seed(0)
    return [build_algorithm("ppo", obs_dim, action_dim, discrete, cfg.algo, 10) for _ in range(count)]


def minibatch(env: str, seeds: int) -> dict[str, torch.Tensor]:
    obs_dim, action_dim, discrete, _, rows = SHAPES[env]
    generator = torch.Generator().manual_seed(0)
    actions = (torch.randint(0, action_dim, (seeds, rows), generator=generator).float() if discrete
               else torch.randn(seeds, rows, action_dim, generator=generator))
    return {"obs": torch.randn(seeds, rows, obs_dim, generator=generator), "actions": actions,
            "log_probs": -torch.rand(seeds, rows, generator=generator), "values": torch.randn(seeds, rows, generator=generator),
            "advantages": torch.randn(seeds, rows, generator=generator),
            "returns": torch.randn(seeds, rows, generator=generator), "mask": torch.ones(seeds, rows)}


def population_and_step(env: str, size: int, mode: str | None):
    """A population of `size` PPO seeds and its program's minibatch step on a synthetic minibatch, as a call that
    carries the parameters and Adam state from call to call (compiled on its first call where mode is None and a
    C++ compiler is found: compile_mode(), which pins the code generator's vector width)."""
    algorithms = algorithms_for(env, "compiled", size)
    population = PopulationBatch(algorithms, [RandomState() for _ in algorithms], mode=mode)
    state = {"params": stack_parameters([a.policy for a in algorithms]),
             "adam": adam_state_from([a.optimizer for a in algorithms], [a.policy for a in algorithms])}
    step_program: PopulationStep = population.steps[0]
    batch, active, lrs = minibatch(env, size), torch.ones(size, dtype=torch.bool), [3e-4] * size

    def step():
        state["params"], state["adam"], _ = step_program(state["params"], state["adam"], batch, lrs, active, {}, {})

    return population, step


def add_case_arguments(parser: argparse.ArgumentParser) -> None:
    """The cases a step tool measures: its tasks' shapes, its population sizes, calls per case and repeats."""
    parser.add_argument("--envs", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--sizes", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)


def measure(env: str, sizes: list[int], calls: int) -> dict[str, tuple[float, float]]:
    """case -> (minibatch step us per seed, act call us per seed)."""
    obs_dim, _, _, num_envs, _ = SHAPES[env]
    out = {}
    single = {key: value[0] for key, value in minibatch(env, 1).items() if key != "mask"}
    obs = torch.randn(num_envs, obs_dim)
    algorithm = algorithms_for(env, "torch", 1)[0]
    with torch.inference_mode():
        act = microseconds(lambda: algorithm.act(obs), calls)
    out["eager torch, one seed"] = (microseconds(lambda: algorithm.minibatch_step(single, algorithm.optimizer), calls),
                                    act)
    # the population's program run eager (no C++ compiler, the tests' mode) for one seed, then as a run compiles
    # it (None: compile_mode(), which pins the code generator's vector width)
    for size, mode in [(1, "eager"), *((size, None) for size in sizes)]:
        population, step = population_and_step(env, size, mode)
        observations = np.random.default_rng(0).standard_normal((size, num_envs, obs_dim)).astype(np.float32)
        acting = np.ones(size, dtype=bool)
        step(), population.act(observations, acting)  # compiled here (if compiled), outside the timed calls
        with population.unchecked_calls():  # as the trainer calls them: guards checked once per block
            out[f"{mode or 'compiled'}, population of {size}"] = (
                microseconds(step, calls) / size, microseconds(lambda: population.act(observations, acting), calls) / size)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_case_arguments(parser)
    args, started, load_before = parse_timing_args(parser, argv)
    torch.set_num_threads(1)
    rows = []
    for env in args.envs:
        samples = [measure(env, args.sizes, args.calls) for _ in range(args.repeats)]
        reference = statistics.median(sample["eager torch, one seed"][0] for sample in samples)
        for case in samples[0]:
            step = statistics.median(sample[case][0] for sample in samples)
            act = statistics.median(sample[case][1] for sample in samples)
            rows.append({"env": env, "what": case, "minibatch_step_us_per_seed": round(step),
                         "x_eager_step": round(step / reference, 2), "act_us_per_seed": round(act, 1)})
    table = print_table(rows, f"one thread, {args.calls} calls per case, medians of {args.repeats}")
    if args.out:
        write_timing_table(args.out, "One minibatch step and one act call, per seed", "benchmarks.speed.population_step",
                           argv, started, load_before, None,
                           "Microseconds per seed: a minibatch step (loss, gradient, norm clip, Adam) on a synthetic "
                           "minibatch of the recipe's size, and one act call on the task's envs; `x_eager_step` = "
                           "against the eager torch step for one seed, measured in the same run.",
                           table)


if __name__ == "__main__":
    main()
