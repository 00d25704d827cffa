"""Hydra callback: at the end of a sweep, say which jobs completed and which failed.

Hydra 1.3 reports only the first failure of a multirun (hydra#2284), and with
the joblib or submitit launchers the jobs run elsewhere. This callback reads
the sweep directory instead: every run directory of a job of this sweep (its .job
mark, written by run.py as the job starts, is newer than the sweep's start and
carries this sweep's id, so that another sweep training into the same directory
at the same time is not reported as this one's; a batch job's runs are its
seeds' directories) either holds a summary.json with status
"complete" or "paused" (pause_at_steps), or it failed. run.py lets a failing
job record its error and return, so the other jobs go on; this callback then
lists the failures and exits non-zero. A rerun that trained nothing (every run
complete already) leaves the sweep's files byte-identical: multirun.yaml is put back.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf


def job_status(job_dir: Path, refused: str | None = None) -> tuple[str, str]:
    """A run's status as its summary says, unless this sweep refused its job's config (`refused`): a complete
    run stored there earlier is not this sweep's result."""
    from benchmarks.runs import read_summary

    if refused is not None:
        return "failed", refused
    summary = read_summary(job_dir)
    if summary["status"] == "partial":
        return "failed", "no summary.json (killed, or failed before training)"
    return summary["status"], summary.get("error", "")


JOB_MARK = ".job"  # written by run.py into every job's directory as the job starts: {"seeds": [...] or null,
# "sweep": the id of the sweep that launched it}, and "refused": the config error, where the job's config was refused
SWEEP_ID = "PPO_BENCH_SWEEP_ID"  # the environment variable that gives a sweep's jobs its id (launchers pass the
# environment on: joblib's workers, submitit's local and Slurm jobs)


def job_mark(job_dir: Path) -> dict:
    return json.loads((job_dir / JOB_MARK).read_text())


def write_job_mark(job_dir: Path, mark: dict) -> None:
    """Atomically: another sweep's end may read it at any moment."""
    from benchmarks.engine.logger import write_json_atomic

    write_json_atomic(job_dir / JOB_MARK, mark)


def sweep_of(job_dir: Path) -> str | None:
    """The id of the sweep that launched the job (None: its launcher dropped the environment); "" for a mark
    that cannot be read (not this sweep's: its own jobs have all ended and written theirs)."""
    try:
        return job_mark(job_dir).get("sweep")
    except (OSError, ValueError):
        return ""


def refuse_job(job_dir: Path, error: str) -> None:
    """Record in the job's mark that this sweep refused its config (the run directory's files stay as they are)."""
    write_job_mark(job_dir, {**job_mark(job_dir), "refused": error})


def job_refusal(job_dir: Path) -> str | None:
    return job_mark(job_dir).get("refused")


def job_run_dirs(job_dir: Path) -> list[Path]:
    """The run directories a job wrote: its own, or for a batch job (seeds=[...]) its seeds' beside it."""
    seeds = job_mark(job_dir).get("seeds")
    if seeds is None:
        return [job_dir]
    from benchmarks.engine.batch_trainer import seed_run_dirs

    return seed_run_dirs(job_dir, list(seeds))


class SweepReport(Callback):
    def __init__(self) -> None:
        self.start = time.time()
        self.previous_multirun: bytes | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        launcher = str(OmegaConf.select(config, "hydra.launcher._target_", default=""))
        if launcher.endswith("SlurmLauncher") and shutil.which("srun") is None:  # submitit's own traceback otherwise
            print("error: hydra/launcher=submitit_slurm submits to a Slurm cluster, and this machine has no srun; "
                  "hydra/launcher=submitit_local or hydra/launcher=joblib run the same jobs here", file=sys.stderr)
            sys.exit(2)
        if launcher.endswith("JoblibLauncher") and OmegaConf.select(config, "hydra.launcher.n_jobs") == 0:
            print("error: hydra.launcher.n_jobs=0 runs no job: give the number of jobs at once (-1: one per core)",
                  file=sys.stderr)  # joblib's own ValueError traceback otherwise
            sys.exit(2)
        if launcher.endswith("JoblibLauncher") and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            # Ctrl-C reaches the launcher and its workers. Left to raise KeyboardInterrupt here, it makes joblib kill
            # the workers mid-iteration; ending the launcher at once, as SIGTERM does, lets each worker finish its
            # iteration, checkpoint and record the stop (tests/test_sweeps.py)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
        self.start = time.time()
        self.sweep_id = f"{os.getpid()}-{time.time_ns()}"
        os.environ[SWEEP_ID] = self.sweep_id  # before the launcher starts any job
        # Hydra's launcher rewrites the sweep's multirun.yaml before any job runs; a rerun that only
        # skips complete runs puts the old one back (below), so it leaves the suite's files as they were.
        multirun = Path(config.hydra.sweep.dir) / "multirun.yaml"
        self.previous_multirun = multirun.read_bytes() if multirun.exists() else None

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        # this sweep's jobs: marked since it started, by it (a mark without an id: a launcher that dropped the
        # environment; counted by its time alone)
        job_dirs = sorted(path.parent for path in sweep_dir.rglob(JOB_MARK) if path.stat().st_mtime >= self.start
                          and sweep_of(path.parent) in (None, self.sweep_id))
        statuses = []
        for job_dir in job_dirs:
            refused = job_refusal(job_dir)
            statuses += [(run_dir, *job_status(run_dir, refused)) for run_dir in job_run_dirs(job_dir)]
        run_dirs = [run_dir for run_dir, _, _ in statuses]
        # paused (pause_at_steps, a pruned study's rungs): stopped where it was asked to, not a failure
        failed = [(run_dir, reason) for run_dir, status, reason in statuses if status not in ("complete", "paused")]
        paused = sum(status == "paused" for _, status, _ in statuses)
        print(f"sweep finished: {len(statuses) - len(failed) - paused} of {len(statuses)} runs complete"
              f"{f', {paused} paused' if paused else ''} ({len(job_dirs)} jobs) under {sweep_dir}")
        for job_dir, reason in failed:
            print(f"  FAILED {job_dir}: {reason}")
        trained = any(not (run_dir / "summary.json").exists() or (run_dir / "summary.json").stat().st_mtime >= self.start
                      for run_dir in run_dirs)
        if self.previous_multirun is not None and not trained:
            (sweep_dir / "multirun.yaml").write_bytes(self.previous_multirun)
        if failed:
            sys.exit(1)
