"""Shared test helpers: compose the real Hydra config, train tiny runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

ROOT = Path(__file__).resolve().parents[1]
# Overrides that keep a run small and quiet: no TensorBoard, no bar, one eval episode.
QUIET = ["logging.tensorboard=false", "logging.progress_bar=false", "eval.episodes=1", "eval.at_start=false"]


def compose_config(overrides: list[str]):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.fixture
def make_config():
    return compose_config
