"""Checkpoints: what a run writes to resume bit for bit (written atomically, the previous one kept as the
fallback), read back only for the same config, and the packing of the random streams they hold."""

from __future__ import annotations

import hashlib
import io
import os
import random
import sys
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from benchmarks import numerics
from benchmarks.engine.config import RETIRED_BACKENDS, differing_keys, numbers_relevant
from benchmarks.engine.logger import write_bytes_atomic


CHECKPOINT_FORMAT = 3  # 3: sub-envs gained the DropStepInfo wrapper layer
CHECKPOINT_FILES = ("checkpoint.pt", "checkpoint.prev.pt")  # newest first; the previous one is the fallback


class CheckpointError(RuntimeError):
    """No usable checkpoint although the run directory says there should be one."""


class CheckpointOfAnotherConfig(CheckpointError):
    """The run directory's checkpoint is of another config (in a sweep: often another of its points); `keys`: the
    dotted keys the two differ in."""

    def __init__(self, message: str, keys: list[str]):
        super().__init__(message)
        self.keys = keys


class CheckpointDamaged(ValueError):
    """A checkpoint file whose bytes do not match the digest written with them."""


def load_checkpoint(run_dir: Path, cfg: DictConfig) -> dict | None:
    """The newest readable checkpoint of this config in run_dir, None if there is none.

    A truncated or unreadable newest file falls back to the previous one; if
    checkpoints exist but none is usable, CheckpointError: never train on garbage.
    """
    problems = []
    for name in CHECKPOINT_FILES:
        path = run_dir / name
        if not path.exists():
            continue
        try:
            checkpoint = read_checkpoint(path)
            if not isinstance(checkpoint, dict) or checkpoint.get("format") != CHECKPOINT_FORMAT:
                raise ValueError(f"not a format-{CHECKPOINT_FORMAT} checkpoint")
        except Exception as error:  # torch raises several types for a damaged zip/pickle
            problems.append(f"{name} is unreadable ({type(error).__name__}: {str(error).splitlines()[0][:120]})")
            continue
        written_on = (checkpoint["config"].get("algo") or {}).get("backend")
        if written_on in RETIRED_BACKENDS:
            raise CheckpointError(f"{path} was written by the retired algo.backend={written_on} "
                                  f"({RETIRED_BACKENDS[written_on]}), which cannot resume it: rerun with "
                                  f"restart=true to train the run afresh")
        stored = numbers_relevant(checkpoint["config"])
        current = numbers_relevant(OmegaConf.to_container(cfg, resolve=True))
        if stored != current:
            keys = differing_keys(stored, current)
            if keys == ["seeds"]:  # the same run, trained in another population: the one remedy is that population
                seeds = stored["seeds"]
                by = (f"a population of seeds=[{','.join(map(str, seeds))}]" if seeds is not None else
                      f"a run of its seed alone (seed={stored['seed']})")
                raise CheckpointOfAnotherConfig(f"{path} was written by {by}, which alone resumes it (the seeds of a "
                                                f"population resume in lockstep); rerun that, or delete this run "
                                                f"directory to train it again", keys)
            raise CheckpointOfAnotherConfig(f"{path} was written with a different config (differs in: "
                                            f"{', '.join(keys)}); choose another run directory or delete this one",
                                            keys)
        written_in = numerics.base_mode(checkpoint.get("numerics", "native"))  # older checkpoints: native
        if written_in != numerics.base_mode(numerics.MODE):
            raise CheckpointError(f"{path} was written with {written_in} float kernels and this process has "
                                  f"{numerics.base_mode(numerics.MODE)} ones: rerun with "
                                  f"{numerics.MODE_VARIABLE}={written_in} to resume it exactly")
        for problem in problems:
            print(f"warning: {problem}; resuming from {name}", file=sys.stderr)
        if problems and name == CHECKPOINT_FILES[1]:
            # The damaged newest is set aside and the good one takes its place, so that the next save
            # rotates a good checkpoint into the fallback slot, not the damaged one.
            newest = run_dir / CHECKPOINT_FILES[0]
            if newest.exists():
                os.replace(newest, run_dir / (CHECKPOINT_FILES[0] + ".damaged"))
            os.replace(path, newest)
        return checkpoint
    if problems:
        raise CheckpointError(f"{run_dir}: " + "; ".join(problems) + ". Delete the run directory to start over")
    return None


def save_checkpoint(checkpoint: dict, run_dir: Path) -> None:
    """Atomic, keeping the previous checkpoint as a fallback: a kill at any instant leaves one whole file."""
    newest, previous = (run_dir / name for name in CHECKPOINT_FILES)
    if newest.exists():
        os.replace(newest, previous)
    save_checkpoint_file(checkpoint, newest)


def pack_rng(python_state, numpy_state, torch_state: torch.Tensor) -> dict:
    """Random states as a checkpoint stores them (tensors and plain values: weights_only-loadable)."""
    name, keys, position, has_gauss, cached_gaussian = numpy_state
    return {"python": python_state, "torch": torch_state,
            "numpy": (name, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached_gaussian)}


def unpack_rng(state: dict) -> tuple:
    """pack_rng's inverse: (python state, numpy state, torch state)."""
    version, internal, gauss = state["python"]
    name, keys, position, has_gauss, cached_gaussian = state["numpy"]
    return ((version, tuple(internal), gauss),
            (name, keys.numpy().astype(np.uint32), position, has_gauss, cached_gaussian), state["torch"])


def rng_states() -> dict:
    return pack_rng(random.getstate(), np.random.get_state(), torch.get_rng_state())


def load_rng_states(state: dict) -> None:
    python_state, numpy_state, torch_state = unpack_rng(state)
    random.setstate(python_state)
    np.random.set_state(numpy_state)
    torch.set_rng_state(torch_state)


def save_atomic(obj, path: Path) -> None:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    write_bytes_atomic(path, buffer.getvalue())  # a failed write leaves no temp file; a full disk is one line


def save_checkpoint_file(checkpoint: dict, path: Path) -> None:
    """The checkpoint serialised, with the SHA-256 of its bytes beside it in the same file (atomic):
    flipped bytes that torch.load would still read are caught by read_checkpoint."""
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    payload = buffer.getvalue()
    save_atomic({"sha256": hashlib.sha256(payload).hexdigest(), "payload": payload}, path)


def read_checkpoint(path: Path) -> dict:
    """save_checkpoint_file's inverse; ValueError if the bytes do not match their digest.
    (Checkpoints written before the digest existed are the checkpoint itself, read as they are.)"""
    stored = torch.load(path, weights_only=True)
    if isinstance(stored, dict) and set(stored) == {"sha256", "payload"}:
        if hashlib.sha256(stored["payload"]).hexdigest() != stored["sha256"]:
            raise CheckpointDamaged("its bytes do not match their SHA-256 digest (damaged on disk)")
        return torch.load(io.BytesIO(stored["payload"]), weights_only=True)
    return stored

