"""Hydra callback: at the end of a sweep, say which jobs completed and which failed.

Hydra 1.3 reports only the first failure of a multirun (hydra#2284), and with
the joblib or submitit launchers the jobs run elsewhere. This callback reads
the sweep directory instead: every run directory of a job written during this
sweep (its .hydra/config.yaml is newer than the sweep's start; a batch job's
runs are its seeds' directories) either holds a summary.json with status
"complete", or it failed. run.py lets a failing
job record its error and return, so the other jobs go on; this callback then
lists the failures and exits non-zero.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


def job_status(job_dir: Path) -> tuple[str, str]:
    summary_path = job_dir / "summary.json"
    if not summary_path.exists():
        return "failed", "no summary.json (killed, or failed before training)"
    try:
        summary = json.loads(summary_path.read_text())
    except json.JSONDecodeError:
        return "failed", "unreadable summary.json"
    return summary.get("status", "unknown"), summary.get("error", "")


def job_run_dirs(job_dir: Path) -> list[Path]:
    """The run directories a job wrote: its own, or for a batch job (seeds=[...]) its seeds' beside it."""
    from omegaconf import OmegaConf

    seeds = OmegaConf.load(job_dir / ".hydra" / "config.yaml").get("seeds")
    if seeds is None:
        return [job_dir]
    from benchmarks.batch_trainer import seed_run_dirs

    return seed_run_dirs(job_dir, list(seeds))


class SweepReport(Callback):
    def __init__(self) -> None:
        self.start = time.time()

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        self.start = time.time()

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        job_dirs = sorted(
            path.parent.parent for path in sweep_dir.rglob(".hydra/config.yaml") if path.stat().st_mtime >= self.start
        )
        run_dirs = [run_dir for job_dir in job_dirs for run_dir in job_run_dirs(job_dir)]
        statuses = [(run_dir, *job_status(run_dir)) for run_dir in run_dirs]
        failed = [(run_dir, reason) for run_dir, status, reason in statuses if status != "complete"]
        print(f"sweep finished: {len(statuses) - len(failed)} of {len(statuses)} runs complete "
              f"({len(job_dirs)} jobs) under {sweep_dir}")
        for job_dir, reason in failed:
            print(f"  FAILED {job_dir}: {reason}")
        if failed:
            sys.exit(1)
