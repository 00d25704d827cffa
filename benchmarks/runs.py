"""Reading stored runs: every directory under a root with a complete summary.json."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.logger import read_csv_complete_rows


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
            status = summary.get("status")
            if status == "failed":
                reason = f"failed: {summary.get('error', 'no reason recorded')}"
            elif status == "interrupted":
                reason = f"interrupted by {summary.get('signal')} at {summary.get('env_steps')} env steps (resumable)"
            elif status != "complete":
                reason = f"unknown status {status!r}"
        if reason is None:
            try:
                eval_log = read_csv_complete_rows(run_dir / "eval.csv")
                episodes = read_csv_complete_rows(run_dir / "episodes.csv")
            except Exception as error:  # missing file, unparsable CSV
                reason = f"corrupt logs ({type(error).__name__}: {error})"
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
