"""The command-line argument types of the suite's tools: each refuses a bad value in one line that says what
it takes (argparse prints it as `<prog>: error: argument <flag>: <line>` and exits 2)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from benchmarks.runs import CONF_ENV, holds_tasks


def existing_directory(text: str) -> Path:
    """argparse type of a run or suite directory argument: a missing one is one line and exit status 2."""
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text} does not exist")
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a directory")
    return path


def number_in(low: float, high: float | None = None, integer: bool = False, closed_low: bool = True):
    """argparse type of a number in [low, high] (or (low, high] with closed_low=False; high None: no bound), an
    integer with integer=True; anything else is one line naming the range."""
    kind = "an integer" if integer else "a number"
    where = ("[" if closed_low else "(") + f"{low}, " + (f"{high}]" if high is not None else "inf)")

    def number(text: str):
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {kind}") from None
        if not (value >= low if closed_low else value > low) or (high is not None and value > high) or value != value:
            raise argparse.ArgumentTypeError(f"must be {kind} in {where}, got {text}")
        return value

    return number


def seed_number(text: str) -> int:
    """argparse type of a seed: an integer in numpy's and Gymnasium's range, [0, 2**32 - 1], as run.py's seed."""
    from benchmarks.engine.config import MAX_SEED

    return number_in(0, MAX_SEED, integer=True)(text)


def conf_name(kind: str):
    """argparse type of a task (kind "env") or preset (kind "algo") name: one of conf/<kind>/<name>.yaml, or one line
    naming what there is."""

    def named(text: str) -> str:
        if (CONF_ENV.parent / kind / f"{text}.yaml").is_file():
            return text
        have = sorted(path.stem for path in (CONF_ENV.parent / kind).glob("*.yaml"))
        raise argparse.ArgumentTypeError(f"no conf/{kind}/{text}.yaml (have: {', '.join(have)})")

    named.__name__ = {"env": "task", "algo": "preset"}.get(kind, kind)  # argparse names the type in its errors
    return named


def suite_directory(text: str) -> Path:
    """argparse type of a suite directory. A folder of two or more suites (results/runs) is refused in one line that
    names them: read as one suite, its suites' runs of a task would be pooled into one comparison."""
    path = existing_directory(text)
    if not holds_tasks(path):
        suites = sorted(child.name for child in path.iterdir() if child.is_dir() and holds_tasks(child))
        if len(suites) > 1:
            named = ", ".join(suites[:3]) + (f" and {len(suites) - 3} more" if len(suites) > 3 else "")
            raise argparse.ArgumentTypeError(f"{text} is a folder of suites ({named}), not one suite: name the "
                                             f"suites, e.g. {path / suites[0]}")
    return path


def existing_file(text: str) -> Path:
    """argparse type of a file argument (a checkpoint): missing, or a directory, is one line."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text} is not a file" if path.exists() else f"{text} does not exist")
    return path


def run_printing_command(main) -> None:
    """Run a command that prints tables, exiting with its status; where its reader stops early (`| head`), it ends
    quietly with status 141 (128 + SIGPIPE, what a shell reports for a Unix tool stopped so) instead of a
    BrokenPipeError traceback."""
    try:
        status = main()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's last flush goes nowhere
        status = 128 + signal.SIGPIPE
    sys.exit(status)
