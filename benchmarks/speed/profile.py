"""Where a training run's time goes, per phase of the loop, from the loop's own timers.

    python -m benchmarks.speed.profile --env HalfCheetah --algo ppo --backend compiled --steps 40960
    python -m benchmarks.speed.profile --env HalfCheetah --seeds 8 --steps 40960     # a population of 8 seeds

Trains one run (no TensorBoard, checkpoints or intermediate evaluation) and prints
the shares of its training wall time that the loop measured for each phase as it
ran (benchmarks/engine/trainer.py LOOP_PHASES, written to summary.json as
"phase_seconds"): acting, the env step with its wrappers, reward scaling,
observation normalisation, the update, evaluation, logging and checkpoints; the
rest (copying rows into the rollout, episode bookkeeping, the loop itself) is
what the timers leave. Start-up (building networks, envs, optimizers) is not in
the training wall time; on the compiled engine the first act and update calls
compile their programs (seconds), inside the act and update phases: give --steps of many iterations to make that
a small share. With --seeds N the run is a population of N seeds (seeds=[0..N-1]): the phases are the population's,
and `us per seed-step` divides each by the N x env steps it trained. Any run's summary.json holds the same figures.
For a finer view of one phase, run py-spy on `run.py` directly.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.arguments import conf_name, number_in

ROOT = Path(__file__).resolve().parents[2]


def phase_shares(summary: dict) -> dict[str, float]:
    """Each timed phase's share of the training wall time, and the rest of the loop's."""
    wall_time = summary["wall_time_s"]
    shares = {phase: seconds / wall_time for phase, seconds in summary["phase_seconds"].items()}
    shares["rest of the loop"] = max(0.0, 1.0 - sum(shares.values()))
    return shares


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="HalfCheetah", type=conf_name("env"))
    parser.add_argument("--algo", default="ppo", type=conf_name("algo"))
    parser.add_argument("--backend", default="compiled", choices=["torch", "compiled"])
    parser.add_argument("--steps", type=int, default=40960, help="env steps per seed")
    parser.add_argument("--seeds", type=number_in(1, integer=True), default=1, help="train a population of this many seeds (seeds=[0..N-1])")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            sys.executable, str(ROOT / "run.py"), f"env={args.env}", f"algo={args.algo}",
            f"algo.backend={args.backend}", f"total_steps={args.steps}", "eval.at_start=false",
            *([f"seeds={list(range(args.seeds))}".replace(" ", "")] if args.seeds > 1 else []),
            f"eval.every_steps={10 * args.steps}", "eval.episodes=1", "logging.tensorboard=false",
            "logging.checkpoint=false", "logging.progress_bar=false", f"hydra.run.dir={tmp}/run",
        ]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:  # the run's own last line says why (a config error is one line)
            raise SystemExit(f"error: the run failed: {(result.stderr.strip().splitlines() or ['no output'])[-1]}")
        run_dir = Path(tmp) / "run" / ("seed0" if args.seeds > 1 else "")  # a population: every seed shares the loop
        summary = json.loads((run_dir / "summary.json").read_text())
    seed_steps = args.seeds * summary["env_steps"]
    print(f"{args.algo} ({args.backend} backend) on {args.env}, {args.seeds} seed(s) x {summary['env_steps']} env "
          f"steps: {summary['wall_time_s']:.1f} s of training ({seed_steps / summary['wall_time_s']:.0f} SPS, "
          f"every seed's steps)")
    print("| phase | seconds | share of training time | us per seed-step |\n|---|---|---|---|")
    shares = phase_shares(summary)
    for phase, share in sorted(shares.items(), key=lambda item: -item[1]):
        seconds = share * summary["wall_time_s"]
        print(f"| {phase} | {seconds:.2f} | {100 * share:.1f}% | {1e6 * seconds / seed_steps:.1f} |")


if __name__ == "__main__":
    main()
