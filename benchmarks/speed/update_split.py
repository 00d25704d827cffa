"""Where a population's update time goes: the compiled minibatch step, the minibatch gathers, and the Python around
them, timed in this process around algorithms/population.py's own functions.

    python -m benchmarks.speed.update_split --env HalfCheetah --seeds 8 --steps 40960

Trains one population (seeds 0..N-1, the task's defaults, no checkpoints or intermediate evaluation) with these
functions wrapped in timers: PopulationBatch.update (the whole update), run_phase (its epochs), PopulationStep's
call (the compiled program of one minibatch step, every seed at once) and gather_minibatches (each loss key's
minibatch rows, an epoch's at once).
The first iteration compiles inside the step: give --steps of many iterations to make that a small share.
`benchmarks.speed.profile` splits the whole loop; this splits its update phase.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from benchmarks.arguments import conf_name, number_in


def timed(totals: dict, name: str, function):
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            totals[name] += time.perf_counter() - started
    return wrapper


def split(env: str, seeds: int, steps: int) -> dict[str, float]:
    """Seconds of the update and of its parts in one population run."""
    from algorithms import population
    from benchmarks.engine.batch_trainer import train_batch
    from benchmarks.engine.config import compose_config

    totals = dict.fromkeys(("update", "epochs", "minibatch step", "minibatch gathers", "training"), 0.0)
    patches = [(population.PopulationBatch, "update", "update"), (population.PopulationBatch, "run_phase", "epochs"),
               (population.PopulationStep, "__call__", "minibatch step"), (population, "gather_minibatches", "minibatch gathers")]
    originals = [(owner, attribute, getattr(owner, attribute)) for owner, attribute, _ in patches]
    for owner, attribute, name in patches:
        setattr(owner, attribute, timed(totals, name, getattr(owner, attribute)))
    cfg = compose_config([f"env={env}", "algo=ppo", f"seeds={list(range(seeds))}".replace(" ", ""), f"total_steps={steps}",
                          "eval.at_start=false", f"eval.every_steps={10 * steps}", "eval.episodes=1",
                          "logging.tensorboard=false", "logging.checkpoint=false", "logging.progress_bar=false"])
    try:
        with tempfile.TemporaryDirectory() as tmp:
            started = time.perf_counter()
            train_batch(cfg, [Path(tmp) / f"seed{seed}" for seed in range(seeds)])
            totals["training"] = time.perf_counter() - started
    finally:
        for owner, attribute, original in originals:
            setattr(owner, attribute, original)
    return totals


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="HalfCheetah", type=conf_name("env"))
    parser.add_argument("--seeds", type=number_in(1, integer=True), default=8, help="the population's size")
    parser.add_argument("--steps", type=number_in(1, integer=True), default=40960, help="env steps per seed")
    args = parser.parse_args(argv)
    totals = split(args.env, args.seeds, args.steps)
    update = totals["update"]
    parts = {"minibatch step (the compiled program)": totals["minibatch step"],
             "minibatch gathers": totals["minibatch gathers"],
             "rest of the epochs": totals["epochs"] - totals["minibatch step"] - totals["minibatch gathers"],
             "rest of the update": update - totals["epochs"]}
    print(f"ppo on {args.env}, {args.seeds} seed(s) x {args.steps} env steps: {totals['training']:.1f} s in all, "
          f"update {update:.1f} s")
    print("| part of the update | seconds | share of the update |\n|---|---|---|")
    for part, seconds in parts.items():
        print(f"| {part} | {seconds:.2f} | {100 * seconds / update:.1f}% |")


if __name__ == "__main__":
    main()
