"""The population engine against its speed targets, in one run: one table, every target beside what was measured.

    python -m benchmarks.speed.engine_targets                    # HalfCheetah and CartPole, CleanRL's values and tuned
    python -m benchmarks.speed.engine_targets --envs CartPole --values recipe --steps 8192 --no-sb3

The targets, each measured side by side in this one process (one torch thread), per task and set of values:
    vs SB3          one seed's SPS >= 3x Stable-Baselines3 PPO's at identical hyperparameters (needs the [bench]
                    extra; whole runs, PPO only)
    8 seeds         8 seeds in one process >= 4x one seed alone's SPS
    update/seed     the minibatch step per seed of a population of 8 <= 1/3 of one seed's step (the compiled step of a
                    population of one, the default, and the eager torch step); CleanRL's minibatch shapes only
    variant cost    every preset's cost per env step <= 1.2x PPO's, alone (1 seed) and batched (8 seeds)
The engine measured is the default one: the population engine (one torch loss over a seed axis, compiled), a single
seed being a population of one. SPS = env steps / (rollout + update time), each run's first iteration (it compiles)
left out. `met` compares the measured ratio with the target.
"""

from __future__ import annotations

import argparse
import importlib.util

from benchmarks.speed.population_step import measure as measure_steps
from benchmarks.speed.seed_throughput import batch_sps, single_sps
from benchmarks.speed.throughput import benchmark_config, ours_sps, parse_timing_args, print_table, sb3_sps, \
    write_timing_table
from benchmarks.speed.variant_cost import PRESETS
from benchmarks.arguments import conf_name

TARGETS = {"vs SB3": (">=", 3.0), "8 seeds": (">=", 4.0), "update/seed": ("<=", 1 / 3), "variant cost": ("<=", 1.2)}


def row(target: str, env: str, values: str, what: str, ratio: float) -> dict:
    sense, bound = TARGETS[target]
    met = ratio >= bound if sense == ">=" else ratio <= bound
    return {"target": target, "env": env, "values": values, "what": what, "measured": round(ratio, 3),
            "bound": f"{sense} {bound:.3g}", "met": "yes" if met else "no"}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", nargs="+", default=["HalfCheetah", "CartPole"], type=conf_name("env"))
    parser.add_argument("--values", nargs="+", default=["recipe", "tuned"], choices=["recipe", "tuned"],
                        help="recipe: CleanRL's values (the family's before tuning); tuned: what a bare command runs")
    parser.add_argument("--steps", type=int, default=16384, help="env steps per seed per measured run")
    parser.add_argument("--algos", nargs="+", default=PRESETS, type=conf_name("algo"), help="the presets of the variant-cost target")
    parser.add_argument("--calls", type=int, default=200, help="minibatch steps timed per case (update/seed)")
    parser.add_argument("--no-sb3", action="store_true", help="skip the SB3 target")
    args, started, load_before = parse_timing_args(parser, argv)
    with_sb3 = not args.no_sb3 and importlib.util.find_spec("stable_baselines3") is not None
    rows = []
    for env in args.envs:
        for values in args.values:
            recipe = values == "recipe"
            print(f"-- {env}, {values} values", flush=True)
            alone = single_sps(env, "ppo", args.steps, recipe)[0]  # the default engine, one seed
            if with_sb3:
                sb3 = sb3_sps(benchmark_config(env, "ppo", [], args.steps, "torch", recipe))
                ours = ours_sps(benchmark_config(env, "ppo", [], args.steps, "compiled", recipe))
                rows.append(row("vs SB3", env, values, "one seed / SB3", ours / sb3))
            cost = {}
            for size in (1, 8):
                cost[size] = {algo: batch_sps(env, algo, args.steps, size, recipe)[0]
                              for algo in dict.fromkeys(["ppo", *args.algos])}
            rows.append(row("8 seeds", env, values, "8 seeds / one seed alone", cost[8]["ppo"] / alone))
            if recipe:
                steps = measure_steps(env, [1, 8], args.calls)
                per_seed_at_8 = steps["compiled, population of 8"][0]
                rows.append(row("update/seed", env, values, "step per seed at 8 / compiled step, one seed",
                                per_seed_at_8 / steps["compiled, population of 1"][0]))
                rows.append(row("update/seed", env, values, "step per seed at 8 / eager torch step, one seed",
                                per_seed_at_8 / steps["eager torch, one seed"][0]))
            for size in (1, 8):
                for algo in args.algos:
                    if algo != "ppo":
                        rows.append(row("variant cost", env, values, f"{algo}, {size} seed{'s' * (size > 1)}",
                                        cost[size]["ppo"] / cost[size][algo]))
    settings = (f"{args.steps} env steps per seed per run, torch threads 1"
                + ("" if with_sb3 else "; SB3 not measured (pip install -e '.[bench]')"))
    table = print_table(rows, settings)
    if args.out:
        write_timing_table(
            args.out, "The population engine against its speed targets", "benchmarks.speed.engine_targets", argv,
            started, load_before, None,
            "Every ratio measured in this one run, on one core: `vs SB3` = our SPS / Stable-Baselines3 PPO's at the "
            "same values; `8 seeds` = 8 seeds in one process / one seed alone (a population of one); "
            "`update/seed` = one minibatch step per seed of a population of 8 / one seed's step, compiled or eager "
            "(CleanRL's minibatch shapes); `variant cost` = PPO's SPS / the preset's at the same number of seeds "
            "(compiled): the preset's cost per env step in PPO's. `recipe` = CleanRL's values, `tuned` = the "
            "defaults a bare command runs. One run per cell: cells move by up to a third between runs.", table)


if __name__ == "__main__":
    main()
