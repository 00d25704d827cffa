"""Reading stored runs: every directory under a root with a complete summary.json."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd


def load_runs(root: Path) -> list[dict]:
    """One dict per complete run: env, algo, seed, env_steps, sps, dir, config, and its eval/episodes tables."""
    runs = []
    for summary_path in sorted(Path(root).rglob("summary.json")):
        summary = json.loads(summary_path.read_text())
        if summary.get("status") != "complete":
            continue
        run_dir = summary_path.parent
        runs.append({
            "env": summary["env"], "algo": summary["algo"], "seed": summary["seed"],
            "env_steps": summary["env_steps"], "sps": summary["sps"], "dir": run_dir, "config": summary["config"],
            "eval": pd.read_csv(run_dir / "eval.csv"),
            "episodes": pd.read_csv(run_dir / "episodes.csv"),
        })
    return runs
