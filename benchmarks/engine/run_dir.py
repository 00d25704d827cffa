"""The run directory and its provenance: one process trains in a directory at a time (run_lock), and every
summary records the versions, the machine and the commit it was made with."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import platform
import subprocess
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from benchmarks import numerics
from benchmarks.engine.config import PROJECT_ROOT
from benchmarks.runs import LOCK_FILE


class RunLockedError(RuntimeError):
    """Another live process is training in this run directory."""


def run_lock(run_dir: Path):
    """Hold run_dir/.lock for as long as this process trains there; a second process is refused."""
    return held_lock(run_dir / LOCK_FILE, lambda holder: RunLockedError(
        f"{run_dir} is being trained by another process (pid {holder}); wait for it to finish, or choose another run "
        f"directory"))


@contextlib.contextmanager
def held_lock(path: Path, refusal: Callable[[str], BaseException]):
    """Hold the lock file `path` (holding this process's pid) while the block runs; another process is refused with
    refusal(its holder's pid).

    flock: the kernel releases it when the holder exits, however it exits (kill -9 included),
    so a stale lock never blocks a resume.
    """
    import fcntl

    while True:
        handle = open(path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise refusal(holder) from None
        # The holder before us removes the file as it releases it: a lock taken on a removed file is no lock.
        try:
            on_disk = os.stat(path)
        except FileNotFoundError:
            on_disk = None
        held = os.fstat(handle.fileno())
        if on_disk is not None and (on_disk.st_dev, on_disk.st_ino) == (held.st_dev, held.st_ino):
            break
        handle.close()
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        yield
    finally:
        path.unlink(missing_ok=True)  # still held: no other process can have taken it; nothing stays behind
        handle.close()


def versions() -> dict:
    import hydra
    import mujoco

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gymnasium": gym.__version__,
        "mujoco": mujoco.__version__,
        "numpy": np.__version__,
        "hydra": hydra.__version__,
    }


def run_label(cfg) -> str:
    """Whose console lines these are: "<env> <algo> seed <k>"."""
    return f"{cfg.env.name} {cfg.algo.name} seed {cfg.seed}"


def machine() -> dict:
    """The CPU a run's numbers were computed on, and the kernels its libraries chose for it: float results
    differ between instruction sets (torch and numpy dispatch AVX2 or AVX-512 kernels at run time), so a
    rerun reproduces bit for bit only where these agree (benchmarks/reproduce.py says when they do not)."""
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    kernels = numerics.kernel_record()  # portable or native kernels, and what each library chose
    return {
        "cpu": cpu,
        "torch_cpu_capability": kernels["torch_cpu_capability"],
        "numpy_simd": kernels["numpy_simd"],
        "numpy_blas": np.show_config(mode="dicts").get("Build Dependencies", {}).get("blas", {}).get("name"),
        "numerics": kernels,
    }


def algorithm_source(kind: str) -> dict | None:
    """Where the code of a module:Class algorithm came from: its module's file and the sha256 of that file (the
    commit records the suite's code; a module of one's own may live outside it). None for a registered name."""
    return module_source(kind.split(":")[0]) if isinstance(kind, str) and ":" in kind else None


def module_source(module_name: str) -> dict:
    """A module's file and the sha256 of its bytes (None for both where the module has no file)."""
    file = getattr(importlib.import_module(module_name), "__file__", None)
    if file is None:
        return {"module": module_name, "file": None, "sha256": None}
    return {"module": module_name, "file": str(Path(file).resolve()), "sha256": file_sha256(Path(file))}


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def git_commit() -> str | None:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=PROJECT_ROOT,
                               capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if commit.returncode != 0:
        return None
    return commit.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")

