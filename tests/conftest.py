"""Shared test helpers: compose the real Hydra config, train tiny runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.engine.config import compose_config  # noqa: F401  (tests import it from here)

ROOT = Path(__file__).resolve().parents[1]
# Overrides that keep a run small and quiet: no TensorBoard, no bar, one eval episode.
QUIET = ["logging.tensorboard=false", "logging.progress_bar=false", "eval.episodes=1", "eval.at_start=false"]


@pytest.fixture
def make_config():
    return compose_config

