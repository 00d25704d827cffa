"""Metrics sinks: CSV (flushed every row), TensorBoard event files, terminal progress bar."""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

from tqdm import tqdm


class CSVLog:
    """Append-only CSV whose columns are fixed by the first row; flushed per row so a crash loses nothing."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.file = open(self.path, "w", newline="")
        self.writer: csv.DictWriter | None = None

    def write(self, row: dict) -> None:
        if self.writer is None:
            self.writer = csv.DictWriter(self.file, fieldnames=list(row))
            self.writer.writeheader()
        self.writer.writerow({key: format_value(value) for key, value in row.items()})
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def format_value(value):
    # repr-exact floats: determinism tests compare CSVs across runs.
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    return value


class RunLogger:
    """train.csv (one row per iteration), eval.csv (one row per evaluation), TensorBoard, progress bar."""

    def __init__(self, run_dir: Path, total_steps: int, tensorboard: bool, progress_bar: bool):
        self.run_dir = Path(run_dir)
        self.train_csv = CSVLog(self.run_dir / "train.csv")
        self.eval_csv = CSVLog(self.run_dir / "eval.csv")
        self.tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(log_dir=str(self.run_dir / "tb"))
        # disable=None: the bar shows on a terminal and stays silent in logs and CI.
        self.bar = tqdm(total=total_steps, unit="step", dynamic_ncols=True, disable=None if progress_bar else True)

    def log_train(self, row: dict) -> None:
        self.train_csv.write(row)
        self.write_tb("train", row)
        self.bar.n = row["env_steps"]
        postfix = {"sps": f"{row['sps']:.0f}"}
        if math.isfinite(row.get("episode_return_mean", math.nan)):
            postfix["return"] = f"{row['episode_return_mean']:.1f}"
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.refresh()

    def log_eval(self, row: dict) -> None:
        self.eval_csv.write(row)
        self.write_tb("eval", row)
        self.bar.write(f"eval @ {row['env_steps']} steps: return {row['eval_return_mean']:.2f} +- {row['eval_return_std']:.2f}")

    def write_tb(self, prefix: str, row: dict) -> None:
        if self.tb is None:
            return
        step = row["env_steps"]
        for key, value in row.items():
            if key != "env_steps" and isinstance(value, (int, float)) and math.isfinite(value):
                self.tb.add_scalar(f"{prefix}/{key}", value, step)

    def close(self) -> None:
        self.bar.close()
        self.train_csv.close()
        self.eval_csv.close()
        if self.tb is not None:
            self.tb.close()


def write_json_atomic(path: Path, data: dict) -> None:
    """Write to a temp file then rename: a reader never sees a half-written summary."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
