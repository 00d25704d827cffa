"""Shared test helpers: compose the real Hydra config, train tiny runs."""

from __future__ import annotations

import os
from pathlib import Path

import benchmarks  # noqa: F401, I001  (first: it pins numpy's and torch's kernels before they load)
import pandas as pd
import pytest

from benchmarks.engine.config import compose_config  # noqa: F401  (tests import it from here)

ROOT = Path(__file__).resolve().parents[1]
# The population engine's program runs eagerly in tests (the same code: loss terms, torch.func over the seed axis,
# the masked Adam), without a compile per program and process; the tests of what compiling adds - guards, no
# recompile, the pinned vector width, bit-exact reruns of the compiled CI reference, resume of a compiled run -
# ask for it with the `compiled` fixture. Subprocesses (run.py) inherit the setting.
os.environ.setdefault("POPULATION_COMPILE", "0")
# Overrides that keep a run small and quiet: no TensorBoard, no bar, one eval episode.
QUIET = ["logging.tensorboard=false", "logging.progress_bar=false", "eval.episodes=1", "eval.at_start=false"]
# Two epochs of 8 minibatches per update: the same masks, padding and per-seed steps as a tuned preset's hundreds
# (CartPole's 14 x 32, the MuJoCo studies' 13 x 64), at a fraction of an eager update's cost; for tests of what
# the update's size does not change (resume, reproduce, signals, a seed that stops).
SMALL_UPDATE = ["env.hparams.update_epochs=2", "env.hparams.num_minibatches=8"]


def pytest_collection_modifyitems(items):
    """The slow tests first (stable: each group keeps its order). With `-n 2` and pyproject's `--dist worksteal`
    each worker starts with half of the list in order, so one starts on the slow tests and the other on short ones;
    a worker that runs out takes half of what the other still has queued, short tests first (from its end), so the
    long tests are not left to the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture
def make_config():
    return compose_config


@pytest.fixture
def compiled(monkeypatch):
    """The population's program compiled, as a run outside the tests is (a C++ compiler present)."""
    monkeypatch.setenv("POPULATION_COMPILE", "1")


def before_each_update(monkeypatch, hook) -> None:
    """hook(algorithm, rollout, iteration) before every update on either backend: the eager backend's PPO.update and
    the population's update (the compiled engine, where PPO.update itself does not run)."""
    from algorithms.population import PopulationBatch
    from algorithms.ppo import PPO

    eager_update, population_update = PPO.update, PopulationBatch.update

    def eager(self, rollout, iteration):
        hook(self, rollout, iteration)
        return eager_update(self, rollout, iteration)

    def population(self, rollouts, iteration, active):
        if self.vectorized:  # else each seed's own update runs, PPO.update's hook included
            for algorithm, rollout, on in zip(self.algorithms, rollouts, active):
                if on:
                    hook(algorithm, rollout, iteration)
        return population_update(self, rollouts, iteration, active)

    monkeypatch.setattr(PPO, "update", eager)
    monkeypatch.setattr(PopulationBatch, "update", population)


def assert_identical_logs(alone: Path, in_population: Path) -> None:
    """Every logged number equal (not close): train.csv, eval.csv and episodes.csv, timing columns aside."""
    for name in ("train.csv", "eval.csv", "episodes.csv"):
        expected, got = pd.read_csv(alone / name), pd.read_csv(in_population / name)
        numbers = [c for c in expected.columns if c not in ("wall_time", "sps", "rollout_time", "update_time")]
        assert list(got.columns) == list(expected.columns), name
        pd.testing.assert_frame_equal(got[numbers], expected[numbers], check_exact=True, obj=name)
