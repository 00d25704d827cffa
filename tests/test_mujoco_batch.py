"""Batched MuJoCo physics (benchmarks/engine/mujoco_batch.py): every seed's sub-envs stepped by one
mujoco.batch.Batch give, bit for bit, what Gymnasium v5's own envs give - observations, rewards, terminations,
truncations, resets and episode statistics - over thousands of steps and many episode ends, with the tasks'
own arguments; a population trained, paused and resumed on it logs what it logs without it."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from benchmarks.engine import batch_trainer, mujoco_batch
from benchmarks.engine.batch_trainer import LockstepEnvs, train_batch
from benchmarks.engine.config import compose_config
from benchmarks.engine.env_state import load_vector_env_state, vector_env_state
from benchmarks.engine.envs import make_vector_env
from benchmarks.runs import read_summary
from tests.test_resume import assert_same_metrics

SEEDS, NUM_ENVS = 3, 2


def lockstep(env_id: str, batched: bool | None, num_envs: int = NUM_ENVS, **kwargs) -> LockstepEnvs:
    vector_envs = [make_vector_env(env_id, num_envs, seed=seed, env_kwargs=kwargs) for seed in range(SEEDS)]
    for seed, envs in enumerate(vector_envs):
        envs.reset(seed=seed)
    return LockstepEnvs(vector_envs, batched_physics=batched)


def resumed(envs: LockstepEnvs, env_id: str, **kwargs) -> LockstepEnvs:
    """What a checkpoint and a resume do: each seed's env state saved, loaded into new envs, a new env layer."""
    envs.to_layers()
    states = [vector_env_state(vector_envs) for vector_envs in envs.vector_envs]
    num_envs = len(envs.sub_envs[0])
    fresh = [make_vector_env(env_id, num_envs, seed=seed, env_kwargs=kwargs) for seed in range(SEEDS)]
    for vector_envs, state in zip(fresh, states):
        load_vector_env_state(vector_envs, state)
    return LockstepEnvs(fresh, batched_physics=True)


def step_both_alike(gymnasium: LockstepEnvs, batched: LockstepEnvs, actions, active, t: int) -> np.ndarray:
    """One step of both env layers, which must give the same numbers, bit for bit; the episodes that ended."""
    expected_obs, expected_ended = gymnasium.step(actions, active)
    obs, ended = batched.step(actions, active)
    assert np.array_equal(obs, expected_obs), t
    assert np.array_equal(ended, expected_ended), t
    for name in ("rewards", "terminated", "truncated", "episode_returns", "episode_lengths", "autoreset"):
        assert np.array_equal(getattr(batched, name), getattr(gymnasium, name)), (t, name)
    return expected_ended


@pytest.mark.parametrize("env_id, kwargs, min_ends", [
    ("HalfCheetah-v5", {}, 6),  # 1,000-step time limits only
    ("HalfCheetah-v5", {"exclude_current_positions_from_observation": False, "ctrl_cost_weight": 0.5,
                        "max_episode_steps": 300, "frame_skip": 3}, 30),
    ("Hopper-v5", {}, 300),  # falls: terminations
    ("Hopper-v5", {"terminate_when_unhealthy": False, "healthy_reward": 2.0}, 6),
    ("Hopper-v5", {"frame_skip": 2, "healthy_z_range": (0.9, float("inf")), "healthy_angle_range": (-0.1, 0.1),
                   "healthy_state_range": (-50.0, 50.0)}, 300),
    ("Walker2d-v5", {}, 300),
    ("Walker2d-v5", {"healthy_z_range": (0.9, 1.8), "healthy_angle_range": (-0.5, 0.5)}, 300),
    ("Swimmer-v5", {"forward_reward_weight": 2.0, "exclude_current_positions_from_observation": False}, 6),
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
        expected_ended = step_both_alike(gymnasium, batched, actions, active, t)
        if t == 1111:  # mid-episode everywhere on HalfCheetah: TimeLimit's counts carried over too
            batched = resumed(batched, env_id, **kwargs)
        ends += int(expected_ended.sum())
    assert ends >= min_ends


def test_tasks_it_does_not_cover_other_wrappers_and_fewer_than_4_sub_envs_keep_gymnasiums_step():
    assert lockstep("Ant-v5", True).physics is None  # reads contact forces
    assert lockstep("Pendulum-v1", True).physics is None
    two = make_vector_env("Hopper-v5", 2, seed=0)
    two.reset(seed=0)
    assert LockstepEnvs([two]).physics is None  # the default: from 4 sub-envs on
    assert LockstepEnvs([two], batched_physics=True).physics is not None
    four = [make_vector_env("Hopper-v5", 2, seed=seed) for seed in (0, 1)]
    for seed, envs in enumerate(four):
        envs.reset(seed=seed)
    assert LockstepEnvs(four).physics is not None
    sub_envs = [LockstepEnvs.layer(make_vector_env("Hopper-v5", 2, seed=s), gym.vector.SyncVectorEnv).envs
                for s in range(2)]
    assert mujoco_batch.batchable(sub_envs)
    assert not mujoco_batch.batchable([sub_envs[0], [gym.wrappers.ClipReward(sub_envs[1][0], -1, 1), sub_envs[1][1]]])
    other = LockstepEnvs.layer(make_vector_env("Hopper-v5", 2, seed=0, env_kwargs={"healthy_reward": 2.0}),
                               gym.vector.SyncVectorEnv).envs
    assert not mujoco_batch.batchable([sub_envs[0], other])  # one set of arguments for the whole batch


@pytest.mark.parametrize("env_id", ["HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Swimmer-v5"])
def test_the_batch_carries_mujocos_whole_integration_state(env_id):
    import mujoco

    physics = lockstep(env_id, True).physics
    assert sum(view[0].size for view in physics.state.values()) == mujoco.mj_stateSize(
        physics.tasks[0].model, mujoco.mjtState.mjSTATE_INTEGRATION)


def test_a_population_on_batched_physics_logs_what_it_logs_without_and_resumes_exactly(monkeypatch, tmp_path):
    assert_batched_population_logs_what_it_logs_without("Hopper", batch_trainer, "BatchedLocomotion", monkeypatch,
                                                         tmp_path)


def assert_batched_population_logs_what_it_logs_without(env: str, module, kind: str, monkeypatch, tmp_path) -> None:
    """A population of 2 seeds x 2 envs on the batch (module.kind, counted), paused mid-episode and resumed on
    Gymnasium's step, logs every number it logs on Gymnasium's step throughout."""
    monkeypatch.setenv("POPULATION_COMPILE", "0")  # the same loop and parts as compiled, without compile time
    overrides = [f"env={env}", "algo=ppo", "algo.backend=compiled", "seeds=[0,1]", "env.num_envs=2",
                 "env.num_steps=256", "env.hparams.update_epochs=2", "env.hparams.num_minibatches=2",
                 "total_steps=1536", "eval.every_steps=1024", "eval.episodes=1", "logging.progress_bar=false",
                 "logging.tensorboard=false"]

    def run(name: str, *extra: str) -> list:
        dirs = [tmp_path / name / f"seed{seed}" for seed in (0, 1)]
        train_batch(compose_config([*overrides, *extra]), dirs)
        return dirs

    made = []

    class Counted(getattr(module, kind)):
        def __init__(self, sub_envs):
            made.append(1)
            super().__init__(sub_envs)

    monkeypatch.setattr(module, kind, Counted)
    batched = run("batched", "batched_physics=true")
    assert made  # the population's envs stepped on the batch
    paused = run("paused", "pause_at_steps=1000", "batched_physics=true")  # checkpointed at 1024 steps, mid-episode
    assert [read_summary(d)["status"] for d in paused] == ["paused", "paused"]
    before = len(made)
    run("paused", "batched_physics=false")  # resumed on Gymnasium's step: the switch changes no number
    gymnasium = run("gymnasium", "batched_physics=false")
    assert len(made) == before
    for seed in (0, 1):
        assert_same_metrics(batched[seed], gymnasium[seed])
        assert_same_metrics(paused[seed], gymnasium[seed])


def test_a_reset_row_counts_mujocos_warnings_afresh_as_its_sub_env_does():
    """MuJoCo says an instability warning the first time it counts one in a simulation; Gymnasium's reset zeroes
    the counts, so a reset row of the batch starts counting afresh too, and a checkpoint stores the counts."""
    envs = lockstep("Hopper-v5", True)
    physics = envs.physics
    physics.warnings[0, :, 1] = 3  # row 0 warned earlier in its episode
    physics.warnings[1, :, 1] = 2
    envs.sub_envs[0][0].reset(seed=7)
    physics.load([0])
    assert (physics.warnings[0] == 0).all() and (physics.warnings[1, :, 1] == 2).all()
    physics.store()
    assert [warning.number for warning in physics.tasks[1].data.warning] == [2] * len(physics.tasks[1].data.warning)
