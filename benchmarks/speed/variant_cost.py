"""What each preset costs per env step against PPO, alone and in a population, on the population engine.

    python -m benchmarks.speed.variant_cost                                     # every preset, HalfCheetah and CartPole
    python -m benchmarks.speed.variant_cost --envs CartPole --algos ppo hp3o --sizes 1 --steps 8192

Measured in one run, side by side, on one core (torch threads 1), with each family's values before tuning
(CleanRL's recipe, as every speed tool here): for each preset and population size N (--sizes), a population
of N seeds trained with algo.backend=compiled; SPS = N x env steps / (rollout + update time), each run's first
iteration left out (it compiles). `x_ppo_cost` = PPO's SPS at the same N / the preset's: the preset's cost per
env step in units of PPO's (1.2 = 20% dearer). With --repeats R every preset is measured R times, each round starting
one preset later (rotated by one place, so that no preset is always measured at the same point of the machine's
drift): `sps` is the median of its runs, `x_ppo_cost` the median of the rounds' ratios (not the ratio of the
medians, which can differ) and `x_ppo_cost range` their lowest and highest.
`update` says how a population runs the preset's update:
"vectorized" (one compiled program for every seed) or "per_seed" (the algorithm's own eager update, seed by seed).
"""

from __future__ import annotations

import argparse
import statistics

from algorithms import build_algorithm
from benchmarks.engine.envs import make_vector_env, space_dims
from benchmarks.speed.seed_throughput import batch_sps
from benchmarks.speed.throughput import benchmark_config, parse_timing_args, print_table, write_timing_table
from benchmarks.arguments import conf_name, number_in

PRESETS = ["ppo", "ppo_kl", "outer_ppo", "outer_ppo_lr", "outer_ppo_nesterov", "outer_ppo_biased", "hp3o",
           "hp3o_plus"]


def update_kind(env: str, algo: str) -> str:
    """How a population runs this preset's update: what the algorithm declares, for this config."""
    cfg = benchmark_config(env, algo, [], 2048, "compiled")
    envs = make_vector_env(cfg.env.id, 1, 0)
    obs_dim, action_dim, discrete, _ = space_dims(envs, cfg.env.id)
    envs.close()
    algorithm = build_algorithm(cfg.algo.algorithm, obs_dim, action_dim, discrete, cfg.algo, 1)
    return algorithm.population_update


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", nargs="+", default=["HalfCheetah", "CartPole"], type=conf_name("env"))
    parser.add_argument("--algos", nargs="+", default=PRESETS, type=conf_name("algo"),
                        help="presets (ppo is always measured: the unit)")
    parser.add_argument("--sizes", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--steps", type=int, default=8192, help="env steps per seed per measured run")
    parser.add_argument("--repeats", type=number_in(1, integer=True), default=1,
                        help="rounds of every preset, each in another order; medians reported")
    args, started, load_before = parse_timing_args(parser, argv)

    algos = ["ppo"] + [algo for algo in args.algos if algo != "ppo"]
    rows = []
    for env in args.envs:
        for size in args.sizes:
            rounds = []
            for repeat in range(args.repeats):
                order = algos[repeat % len(algos):] + algos[:repeat % len(algos)]
                rounds.append({algo: batch_sps(env, algo, args.steps, size)[0] for algo in order})
            for algo in algos:
                ratios = [sps["ppo"] / sps[algo] for sps in rounds]
                rows.append({"env": env, "seeds": size, "preset": algo, "update": update_kind(env, algo),
                             "sps": round(statistics.median(sps[algo] for sps in rounds)),
                             "x_ppo_cost": round(statistics.median(ratios), 2),
                             "x_ppo_cost range": f"{min(ratios):.2f}-{max(ratios):.2f}"})
    table = print_table(rows, f"algo.backend=compiled, CleanRL's values, {args.steps} env steps per seed per run, "
                              f"{args.repeats} round(s), torch threads 1")
    if args.out:
        write_timing_table(
            args.out, "Each preset's cost per env step against PPO's, on the population engine",
            "benchmarks.speed.variant_cost", argv, started, load_before, None,
            "SPS = env steps of all seeds / (rollout + update time), one core, each run's first iteration left out "
            "(it compiles); `x_ppo_cost` = PPO's SPS at the same number of seeds / the preset's, measured in the same "
            "run; `update`: how a population runs the preset's update (vectorized: one compiled program for every "
            f"seed; per_seed: the algorithm's own eager update, seed by seed). {args.repeats} round(s) of every "
            "preset, each round in another order: `sps` is the median of a preset's runs, `x_ppo_cost` the median of "
            "the rounds' ratios and `x_ppo_cost range` their lowest and highest.", table)


if __name__ == "__main__":
    main()
