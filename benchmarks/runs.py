"""Reading stored runs: every directory under a root with a complete summary.json."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.logger import read_csv_complete_rows


# What the readers of a run take from its summary.json
REQUIRED_SUMMARY_KEYS = ("status", "env", "algo", "seed", "env_steps", "sps", "config")


def numeric_log(path: Path, columns: tuple[str, ...]):
    """A metrics CSV whose `columns` are present, numeric and finite-or-NaN (ValueError naming the problem)."""
    import pandas as pd

    log = read_csv_complete_rows(path)
    missing = [c for c in columns if c not in log.columns]
    if missing:
        raise ValueError(f"{path.name} lacks {', '.join(missing)}")
    if log.empty:
        raise ValueError(f"{path.name} has no rows")
    for column in columns:
        if not pd.api.types.is_numeric_dtype(log[column]):
            raise ValueError(f"{path.name}: column {column} is not numeric (damaged rows)")
    return log


def load_runs(root: Path, skipped: list[tuple[Path, str]] | None = None) -> list[dict]:
    """One dict per complete run: env, algo, seed, env_steps, sps, dir, config, and its eval/episodes tables.

    A run that is not complete - failed, interrupted, still running, or with a
    corrupt summary or log - is left out; `skipped` (if given) receives
    (run directory, reason) for each.
    """
    runs = []
    run_dirs = sorted({path.parent for name in ("summary.json", "train.csv", "train.csv.gz")
                       for path in Path(root).rglob(name) if ".hydra" not in path.parts})
    for run_dir in run_dirs:
        reason = None
        try:
            summary = json.loads((run_dir / "summary.json").read_text())
        except FileNotFoundError:
            reason = "partial: no summary.json (running, or killed: rerun its command to resume)"
        except (OSError, json.JSONDecodeError) as error:
            reason = f"corrupt summary.json ({type(error).__name__})"
        else:
            if not isinstance(summary, dict):
                summary = {"status": "corrupt summary.json (not a mapping)"}
            elif summary.get("status") == "complete" and any(key not in summary for key in REQUIRED_SUMMARY_KEYS):
                missing = ", ".join(key for key in REQUIRED_SUMMARY_KEYS if key not in summary)
                summary = {"status": f"corrupt summary.json (missing {missing})"}
            status = summary.get("status")
            if isinstance(status, str) and status.startswith("corrupt"):
                reason = status
            elif status == "failed":
                reason = f"failed: {summary.get('error', 'no reason recorded')}"
            elif status == "interrupted":
                reason = f"interrupted by {summary.get('signal')} at {summary.get('env_steps')} env steps (resumable)"
            elif status != "complete":
                reason = f"unknown status {status!r}"
        if reason is None:
            try:
                eval_log = numeric_log(run_dir / "eval.csv", ("env_steps", "eval_return_mean"))
                episodes = numeric_log(run_dir / "episodes.csv", ("env_steps", "episode_return"))
                numeric_log(run_dir / "train.csv", ("env_steps", "rollout_time", "update_time"))
            except Exception as error:  # missing file, unparsable CSV, garbage rows
                reason = f"corrupt logs ({type(error).__name__}: {str(error).splitlines()[0][:160]})"
        if reason is not None:
            if skipped is not None:
                skipped.append((run_dir, reason))
            continue
        runs.append({
            "env": summary["env"], "algo": summary["algo"], "seed": summary["seed"],
            "env_steps": summary["env_steps"], "sps": summary["sps"], "dir": run_dir, "config": summary["config"],
            "eval": eval_log, "episodes": episodes,
        })
    return runs
