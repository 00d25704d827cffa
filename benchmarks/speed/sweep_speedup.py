"""Throughput of a joblib sweep vs the same jobs one after another (Hydra's basic launcher).

    python -m benchmarks.speed.sweep_speedup                    # 4 CartPole PPO jobs, 100k steps each, 2 workers
    python -m benchmarks.speed.sweep_speedup --jobs 6 --n-jobs 2 --set env=Acrobot

Both sweeps run the same `python run.py -m ...` command into fresh temporary
directories; the wall time of each whole command is measured, so the joblib
workers' start-up (each imports torch, gymnasium and MuJoCo) counts against
it. Speed-up = sequential wall time / joblib wall time. Run it on an otherwise
idle machine: a background job takes a core away from the parallel sweep.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def timed_sweep(launcher_overrides: list[str], job_overrides: list[str], sweep_dir: Path) -> float:
    command = [sys.executable, str(ROOT / "run.py"), "-m", *launcher_overrides, *job_overrides,
               f"hydra.sweep.dir={sweep_dir}", "logging.progress_bar=false", "logging.tensorboard=false"]
    start = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, text=True)
    return time.perf_counter() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=4, help="number of jobs (seeds 0..jobs-1)")
    parser.add_argument("--n-jobs", type=int, default=2, help="joblib workers")
    parser.add_argument("--steps", type=int, default=100_000, help="total_steps of each job")
    parser.add_argument("--set", nargs="*", default=["env=CartPole", "algo=ppo"], metavar="KEY=VALUE",
                        help="config overrides of every job, as on run.py's command line")
    args = parser.parse_args(argv)
    jobs = [*args.set, f"total_steps={args.steps}", "seed=" + ",".join(map(str, range(args.jobs)))]
    with tempfile.TemporaryDirectory() as tmp:
        sequential = timed_sweep(["hydra/launcher=basic"], jobs, Path(tmp) / "basic")
        parallel = timed_sweep(["hydra/launcher=joblib", f"hydra.launcher.n_jobs={args.n_jobs}"], jobs,
                               Path(tmp) / "joblib")
    total = args.jobs * args.steps
    print(f"{args.jobs} jobs x {args.steps} env steps ({' '.join(args.set)})")
    print(f"one after another (basic launcher): {sequential:7.1f} s  {total / sequential:7.0f} env steps/s")
    print(f"joblib, {args.n_jobs} workers:            {parallel:7.1f} s  {total / parallel:7.0f} env steps/s")
    print(f"speed-up: {sequential / parallel:.2f}x")


if __name__ == "__main__":
    main()
