"""Batched MuJoCo physics (benchmarks/engine/mujoco_batch.py): every seed's sub-envs stepped by one
mujoco.batch.Batch give, bit for bit, what Gymnasium v5's own envs give - observations, rewards, terminations,
truncations, resets and episode statistics - over thousands of steps and many episode ends, with the tasks'
own arguments; a population trained, paused and resumed on it logs what it logs without it."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.engine import batch_trainer, mujoco_batch
from benchmarks.engine.batch_trainer import LockstepEnvs, train_batch
from benchmarks.engine.config import compose_config
from benchmarks.engine.envs import make_vector_env
from benchmarks.runs import read_summary
from tests.test_resume import assert_same_metrics

SEEDS, NUM_ENVS = 3, 2


def lockstep(env_id: str, batched: bool, **kwargs) -> LockstepEnvs:
    vector_envs = [make_vector_env(env_id, NUM_ENVS, seed=seed, env_kwargs=kwargs) for seed in range(SEEDS)]
    for seed, envs in enumerate(vector_envs):
        envs.reset(seed=seed)
    return LockstepEnvs(vector_envs, batched_physics=batched)


@pytest.mark.parametrize("env_id, kwargs, min_ends", [
    ("HalfCheetah-v5", {}, 6),  # 1,000-step time limits only
    ("HalfCheetah-v5", {"exclude_current_positions_from_observation": False, "ctrl_cost_weight": 0.5}, 6),
    ("Hopper-v5", {}, 300),  # falls: terminations
    ("Hopper-v5", {"terminate_when_unhealthy": False, "healthy_reward": 2.0}, 6),
    ("Walker2d-v5", {}, 300),
    ("Swimmer-v5", {"forward_reward_weight": 2.0}, 6),
])
def test_batched_physics_steps_bit_for_bit_as_gymnasium(env_id, kwargs, min_ends):
    gymnasium, batched = lockstep(env_id, False, **kwargs), lockstep(env_id, True, **kwargs)
    assert gymnasium.physics is None and batched.physics is not None
    rng = np.random.default_rng(0)
    action_dim = gymnasium.vector_envs[0].single_action_space.shape[0]
    ends = 0
    for t in range(2400):
        actions = rng.normal(0.0, 1.5, (SEEDS, NUM_ENVS, action_dim)).astype(np.float32)  # beyond the bounds too
        active = np.array([True, t % 7 != 3, t < 2000])  # a stopped seed is not stepped
        expected_obs, expected_ended = gymnasium.step(actions, active)
        obs, ended = batched.step(actions, active)
        assert np.array_equal(obs, expected_obs), t
        assert np.array_equal(ended, expected_ended), t
        for name in ("rewards", "terminated", "truncated", "episode_returns", "episode_lengths", "autoreset"):
            expected, got = getattr(gymnasium, name), getattr(batched, name)
            assert got.dtype == expected.dtype and np.array_equal(got, expected), (t, name)
        if t == 1111:  # what a checkpoint does: the batch's state into the sub-envs and back
            batched.to_layers()
            batched.from_layers()
        ends += int(expected_ended.sum())
    assert ends >= min_ends


def test_tasks_it_does_not_cover_and_a_lone_sub_env_keep_gymnasiums_step():
    assert lockstep("Ant-v5", True).physics is None  # reads contact forces
    assert lockstep("Pendulum-v1", True).physics is None
    alone = make_vector_env("Hopper-v5", 1, seed=0)
    alone.reset(seed=0)
    assert LockstepEnvs([alone], batched_physics=True).physics is None


def test_a_population_on_batched_physics_logs_what_it_logs_without_and_resumes_exactly(monkeypatch, tmp_path):
    monkeypatch.setenv("POPULATION_COMPILE", "0")  # the same loop and parts as compiled, without compile time
    overrides = ["env=Hopper", "algo=ppo", "algo.backend=compiled", "seeds=[0,1]", "env.num_envs=2",
                 "env.num_steps=256", "env.hparams.update_epochs=2", "env.hparams.num_minibatches=2",
                 "total_steps=1536", "eval.every_steps=1024", "eval.episodes=1", "logging.progress_bar=false",
                 "logging.tensorboard=false"]

    def run(name: str, *extra: str) -> list:
        dirs = [tmp_path / name / f"seed{seed}" for seed in (0, 1)]
        train_batch(compose_config([*overrides, *extra]), dirs)
        return dirs

    made = []
    monkeypatch.setattr(batch_trainer, "BatchedLocomotion",
                        lambda sub_envs: made.append(1) or mujoco_batch.BatchedLocomotion(sub_envs))
    batched = run("batched")
    assert made  # the population's envs stepped on the batch
    paused = run("paused", "pause_at_steps=1000")  # checkpointed at 1024 steps, mid-episode
    assert [read_summary(d)["status"] for d in paused] == ["paused", "paused"]
    run("paused")
    monkeypatch.setattr(batch_trainer, "batchable", lambda sub_envs: False)
    gymnasium = run("gymnasium")
    for seed in (0, 1):
        assert_same_metrics(batched[seed], gymnasium[seed])
        assert_same_metrics(paused[seed], gymnasium[seed])
