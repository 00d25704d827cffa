"""Metrics sinks: CSV (flushed every row), TensorBoard event files, terminal progress bar."""

from __future__ import annotations

import csv
import errno
import gzip
import json
import math
import os
from pathlib import Path

import numpy as np
from tqdm import tqdm


# episodes.csv's columns. Its header is written when the run starts, so that a run that finishes no training episode
# (a budget shorter than the task's episodes) leaves a log that says so: a header and no row.
EPISODE_COLUMNS = ("env_steps", "episode_return", "episode_length")


class CSVLog:
    """Append-only CSV whose columns are fixed by its header or else its first row; flushed per row so a crash loses
    nothing.

    resume_at: a byte size returned by `size()` earlier (stored in a checkpoint).
    The file is cut back to it, dropping rows a killed run wrote after its
    last checkpoint, and writing continues from there.
    """

    def __init__(self, path: Path, resume_at: int | None = None, header: tuple[str, ...] | None = None):
        """header: the columns, written at once, so that a log that ends with no row still names them (episodes.csv
        of a run that finished no episode); None: the first row's keys."""
        self.path = Path(path)
        self.writer: csv.DictWriter | None = None
        if resume_at is None:
            self.file = open(self.path, "w", newline="")
            self.start(header)
            return
        size = self.path.stat().st_size if self.path.exists() else -1
        if size < resume_at:
            raise ValueError(f"{self.path} holds {max(size, 0)} bytes, its checkpoint expects at least {resume_at}")
        with open(self.path, "r+b") as raw:
            raw.truncate(resume_at)
        self.file = open(self.path, "a", newline="")
        if resume_at > 0:
            with open(self.path, newline="") as existing:
                header = next(csv.reader(existing))
            self.writer = csv.DictWriter(self.file, fieldnames=header)
        else:  # a checkpoint taken before the log's first line: a log without a header, or one made before its
            self.start(header)  # header was written at the start (episodes.csv of earlier runs)

    def start(self, header: tuple[str, ...] | None) -> None:
        """The header line, when the columns are known."""
        if header is not None:
            self.writer = csv.DictWriter(self.file, fieldnames=list(header))
            self.writer.writeheader()
            self.file.flush()

    def write(self, row: dict) -> None:
        if self.writer is None:
            self.start(tuple(row))
        self.writer.writerow({key: format_value(value) for key, value in row.items()})
        self.file.flush()

    def size(self) -> int:
        """Bytes written so far: where a resume from the current state cuts the file."""
        self.file.flush()
        return os.fstat(self.file.fileno()).st_size

    def close(self) -> None:
        self.file.close()


def format_value(value):
    # repr-exact floats: determinism tests compare CSVs across runs. A numpy or torch scalar (a variant's statistic)
    # is logged as its Python number: its own repr ("np.float64(0.5)", "tensor(0.5000)") would log it as text. A
    # float32 is logged as the float64 it equals (0.10000000149011612, not its shortest text 0.1).
    if getattr(value, "shape", None) == () and hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    return value


class RunLogger:
    """train.csv (one row per iteration), eval.csv (one row per evaluation), TensorBoard, progress bar."""

    def __init__(self, run_dir: Path, total_steps: int, tensorboard: bool, progress_bar: bool,
                 resume: dict | None = None, label: str = ""):
        """resume: {"sizes": {csv name: bytes}, "env_steps": n} from a checkpoint, or None for a fresh run.
        label: whose lines these are (e.g. "Hopper hp3o seed 2"): parallel jobs print to one console."""
        self.run_dir = Path(run_dir)
        self.label = f"{label}: " if label else ""
        sizes = resume["sizes"] if resume else {}
        self.train_csv = CSVLog(self.run_dir / "train.csv", sizes.get("train.csv"))
        self.eval_csv = CSVLog(self.run_dir / "eval.csv", sizes.get("eval.csv"))
        self.tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step: TensorBoard hides what the interrupted process logged after the checkpoint.
            purge_step = resume["env_steps"] + 1 if resume else None
            self.tb = SummaryWriter(log_dir=str(self.run_dir / "tb"), purge_step=purge_step)
        # disable=None: the bar shows on a terminal and stays silent in logs and CI.
        self.bar = tqdm(total=total_steps, initial=resume["env_steps"] if resume else 0, unit="step",
                        dynamic_ncols=True, disable=None if progress_bar else True)

    def sizes(self) -> dict[str, int]:
        return {"train.csv": self.train_csv.size(), "eval.csv": self.eval_csv.size()}

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
        self.bar.write(f"{self.label}eval @ {row['env_steps']} steps: return {row['eval_return_mean']:.2f} +- {row['eval_return_std']:.2f}")

    def write_tb(self, prefix: str, row: dict) -> None:
        if self.tb is None:
            return
        step = row["env_steps"]
        for key, value in row.items():
            if key != "env_steps" and isinstance(value, (int, float)) and math.isfinite(value):
                self.tb.add_scalar(f"{prefix}/{key}", value, step)

    def log_hparams(self, config: dict, metrics: dict) -> None:
        """The run's hyperparameters and final metrics for TensorBoard's HParams view (a sweep's runs side by side)."""
        if self.tb is None:
            return
        hparams = {"algo": config["algo"]["name"], "env": config["env"]["name"], "seed": config["seed"],
                   "total_steps": config["total_steps"]}
        for key, value in flatten(config["algo"], "algo.").items():
            hparams[key] = value if isinstance(value, (bool, int, float, str)) else str(value)
        metrics = {f"hparams/{key}": value for key, value in metrics.items()
                   if isinstance(value, (int, float)) and math.isfinite(value)}
        self.tb.add_hparams(hparams, metrics, run_name=".")  # ".": this run's own event directory

    def close(self) -> None:
        self.bar.close()
        self.train_csv.close()
        self.eval_csv.close()
        if self.tb is not None:
            self.tb.close()


def flatten(node: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    flat = {}
    for key, value in node.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


# The logs' columns that time the run: measurements of the machine it shared, not results. benchmarks.reproduce
# compares every other column; they are read at float32 precision (7 significant digits), the precision
# benchmarks.pack stores them at, so that a plain and a packed log read alike.
TIMING_COLUMNS = ("wall_time", "sps", "rollout_time", "update_time")


def timing_columns(frame) -> list[str]:
    """The frame's timing columns that hold floats."""
    return [column for column in TIMING_COLUMNS if column in frame.columns and frame[column].dtype.kind == "f"]


def at_timing_precision(frame):
    """The frame with its timing columns rounded to float32 precision (kept as float64)."""
    for column in timing_columns(frame):
        frame[column] = frame[column].astype(np.float32).astype(np.float64)
    return frame


def episode_statistics(returns, lengths) -> dict:
    """train.csv's summary of the episodes an iteration finished (NaN where it finished none): what a packed suite
    keeps of the episodes before each run's last 100 (benchmarks/pack.py)."""
    return {"episodes": len(returns),
            "episode_return_mean": float(np.mean(returns)) if len(returns) else float("nan"),
            "episode_return_std": float(np.std(returns)) if len(returns) else float("nan"),
            "episode_length_mean": float(np.mean(lengths)) if len(lengths) else float("nan")}


def read_csv_complete_rows(path: Path):
    """pandas DataFrame of a metrics CSV without a half-written last line (a run killed mid-write).

    A committed run's logs are packed (`python -m benchmarks.pack`): when the CSV is absent, its gzip
    (`<name>.gz`) or else its rows in the nearest suite Parquet file above the run are read. An empty episodes.csv
    (a run that finished no episode, made before the header was written at the start) reads as its header alone.
    """
    import io

    import pandas as pd

    path = Path(path)
    gzipped = path.with_name(path.name + ".gz")
    if path.exists():
        text = path.read_text()
    elif gzipped.exists():
        text = gzip.decompress(gzipped.read_bytes()).decode()
    else:
        from benchmarks.pack import read_packed_log

        return read_packed_log(path)
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    if not text and path.name == "episodes.csv":  # a run that finished no episode, made before the header came first
        text = ",".join(EPISODE_COLUMNS) + "\n"
    # each float exactly as written (repr), the timings at the precision a packed log keeps
    return at_timing_precision(pd.read_csv(io.StringIO(text), float_precision="round_trip"))


class DiskFullError(RuntimeError):
    """A file could not be written for lack of space (or quota); its temp file was removed."""


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write to a temp file then rename: a reader never sees a half-written file. If the write fails, no temp file
    stays behind, and a full disk is one DiskFullError naming the file (the previous version of it is kept)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as error:
        tmp.unlink(missing_ok=True)
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(f"no space left on the device to write {path}: nothing half-written is left, and a "
                                f"resume starts from the last whole checkpoint; free space and rerun the same "
                                f"command") from None
        raise


def write_json_atomic(path: Path, data: dict) -> None:
    """A summary or record as JSON, written atomically (write_bytes_atomic)."""
    write_bytes_atomic(path, json.dumps(data, indent=2, default=str).encode())
