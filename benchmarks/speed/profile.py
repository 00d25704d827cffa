"""Where a training run's time goes: py-spy samples of one run, summed into the trainer's phases.

    python -m benchmarks.speed.profile --env HalfCheetah --algo ppo --backend torch --steps 40960

Trains one run (no TensorBoard, checkpoints or intermediate evaluation) under
`py-spy record` (`pip install -e .[bench]`) and attributes every sample taken
inside benchmarks.engine.trainer.train to the phase the training loop was in: the env
step with its wrappers, acting, observation normalisation, reward scaling, the
update (split into the minibatch steps' loss/gradient, the optimizer step, and
GAE/batch preparation), evaluation, and the rest of the loop. Start-up
(building networks, envs, the optimizer) is reported apart and excluded from
the shares of training time.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# (phase, predicate on the frame just below train()); first match wins.
LOOP_PHASES = [
    ("update", lambda frame: frame.split(" ")[0].endswith(".update")),
    ("env step (with wrappers)", lambda frame: frame.split(" ")[0].endswith(".step")),
    ("act", lambda frame: frame.split(" ")[0].endswith(".act")),
    ("observation normalisation", lambda frame: frame.startswith("ObservationNormalizer.")),
    ("reward scaling", lambda frame: frame.startswith("RewardScaler.")),
    ("evaluation", lambda frame: "run_evaluation" in frame),
    ("start-up", lambda frame: any(name in frame for name in (
        "build_algorithm", "make_vector_env", "Evaluator.__init__", "RunLogger.__init__", "reset", "versions",
        "git_commit", "seed_everything", "load_checkpoint", "Rollout.allocate"))),
]


def phase_of(stack: list[str]) -> str | None:
    """The phase of one sampled stack (innermost frame last), or None outside train()."""
    for index, frame in enumerate(stack):
        if frame.startswith("train (") and "trainer.py" in frame:
            below = stack[index + 1:]
            if not below:
                return "training loop (itself)"
            for phase, matches in LOOP_PHASES:
                if matches(below[0]):
                    if phase == "update":
                        return update_part(below)
                    return phase
            return "training loop (itself)"
    return None


def update_part(stack: list[str]) -> str:
    if any(frame.startswith("Optimizer.") or "optimizer.py" in frame or "adam.py" in frame or "sgd.py" in frame
           for frame in stack):
        return "update: optimizer step"
    if any("minibatch_step" in frame for frame in stack):
        return "update: minibatch loss + gradient"
    return "update: GAE, batches, statistics"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="HalfCheetah")
    parser.add_argument("--algo", default="ppo")
    parser.add_argument("--backend", default="torch", choices=["torch", "numpy"])
    parser.add_argument("--steps", type=int, default=40960)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "profile.txt"
        command = [
            "py-spy", "record", "-r", str(args.rate), "-f", "raw", "-o", str(raw), "--",
            sys.executable, str(ROOT / "run.py"), f"env={args.env}", f"algo={args.algo}",
            *([f"algo.backend={args.backend}"] if args.backend != "torch" else []),  # the default, as before it existed
            f"total_steps={args.steps}", "eval.at_start=false",
            f"eval.every_steps={10 * args.steps}", "eval.episodes=1", "logging.tensorboard=false",
            "logging.checkpoint=false", "logging.progress_bar=false", f"hydra.run.dir={tmp}/run",
        ]
        subprocess.run(command, check=True, capture_output=True)
        samples: Counter[str] = Counter()
        for line in raw.read_text().splitlines():
            stack, count = line.rsplit(" ", 1)
            phase = phase_of(stack.split(";"))
            if phase is not None:
                samples[phase] += int(count)
    training = sum(n for phase, n in samples.items() if phase != "start-up")
    print(f"{args.algo} ({args.backend} backend) on {args.env}, {args.steps} env steps: "
          f"{training} samples in training, {samples['start-up']} in start-up (excluded)")
    print("| phase | share of training time |\n|---|---|")
    for phase, n in sorted(samples.items(), key=lambda item: -item[1]):
        if phase != "start-up":
            print(f"| {phase} | {100 * n / training:.1f}% |")


if __name__ == "__main__":
    main()
