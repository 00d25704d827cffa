"""Batched CartPole (benchmarks/engine/classic_batch.py): every seed's sub-envs stepped as numpy arrays give, bit
for bit, what Gymnasium's own CartPole gives - observations, rewards, terminations, truncations, resets and
episode statistics - over thousands of steps, falls and time limits; a population trained, paused and resumed
on it logs what it logs without it."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

from benchmarks import numerics
from benchmarks.engine import batch_trainer, classic_batch
from benchmarks.engine.batch_trainer import LockstepEnvs
from tests.conftest import ROOT
from tests.test_mujoco_batch import assert_batched_population_logs_what_it_logs_without, lockstep, resumed, \
    step_both_alike


def balancing_actions(envs: LockstepEnvs, rng: np.random.Generator, skill: float) -> np.ndarray:
    """Push towards the pole's fall (long episodes, up to the time limit) with probability `skill`, else at random."""
    theta, theta_dot = envs.raw_obs[..., 2], envs.raw_obs[..., 3]
    push = (theta + 0.5 * theta_dot > 0).astype(np.int64)
    return np.where(rng.random(push.shape) < skill, push, rng.integers(0, 2, push.shape))


@pytest.mark.parametrize("kwargs", [{}, {"sutton_barto_reward": True}])
def test_batched_cartpole_steps_bit_for_bit_as_gymnasium(kwargs):
    gymnasium, batched = lockstep("CartPole-v1", False, **kwargs), lockstep("CartPole-v1", True, **kwargs)
    assert gymnasium.physics is None and isinstance(batched.physics, classic_batch.BatchedCartPole)
    rng = np.random.default_rng(0)
    falls = time_limits = 0
    for t in range(6000):
        actions = balancing_actions(gymnasium, rng, skill=0.97 if t < 3000 else 0.0)
        active = np.array([True, t % 7 != 3, t < 5000])  # a stopped seed is not stepped
        step_both_alike(gymnasium, batched, actions, active, t)
        # the float64 state too (the observations are its float32 rounding)
        states = np.stack([env.unwrapped.state for row in gymnasium.sub_envs for env in row])
        assert np.array_equal(batched.physics.state, states), t
        if t in (1233, 4320):  # mid-episode: the state and the time limits' counts carried over into new envs
            batched = resumed(batched, "CartPole-v1", **kwargs)
            assert isinstance(batched.physics, classic_batch.BatchedCartPole)
        falls += int(gymnasium.terminated.sum())
        time_limits += int((gymnasium.truncated & ~gymnasium.terminated).sum())
    assert falls >= 100 and time_limits >= 6


def test_a_sub_env_stepped_after_its_fall_gets_gymnasiums_reward_and_count():
    """The autoreset never steps a fallen pole, but the batch keeps Gymnasium's rule for it: reward 0 and a count
    of the steps beyond the fall, stored back into the sub-env for its checkpoint."""
    envs = lockstep("CartPole-v1", True)
    physics, task = envs.physics, envs.physics.tasks[0]
    physics.state[0] = (0.0, 0.0, 0.25, 0.0)  # beyond the 12-degree threshold: every step ends the episode
    rows = np.array([0])
    _, rewards, terminated = physics.step(rows, np.array([1]))
    assert terminated[0] and rewards[0] == 1.0 and physics.steps_beyond[0] == 0
    for beyond in (1, 2):
        _, rewards, terminated = physics.step(rows, np.array([1]))
        assert terminated[0] and rewards[0] == 0.0 and physics.steps_beyond[0] == beyond
    physics.store()
    assert task.steps_beyond_terminated == 2 and np.array_equal(task.state, physics.state[0])
    task.reset(seed=1)
    physics.load([0])
    assert physics.steps_beyond[0] == -1 and np.array_equal(physics.state[0], task.state)


def test_other_wrappers_and_differing_arguments_keep_gymnasiums_step():
    def sub_envs(**kwargs):
        return [LockstepEnvs.layer(batch_trainer.make_vector_env("CartPole-v1", 2, seed=s, env_kwargs=kwargs),
                                   gym.vector.SyncVectorEnv).envs for s in range(2)]

    plain = sub_envs()
    assert classic_batch.batchable(plain)
    assert not classic_batch.batchable([plain[0], [gym.wrappers.ClipReward(plain[1][0], 0, 0.5), plain[1][1]]])
    assert not classic_batch.batchable([plain[0], sub_envs(sutton_barto_reward=True)[0]])
    assert lockstep("Acrobot-v1", True).physics is None
    # by default from 8 sub-envs on, where the batch measured faster than Gymnasium's per-env calls
    assert lockstep("CartPole-v1", None).physics is None  # 3 seeds x 2 envs
    eight = [batch_trainer.make_vector_env("CartPole-v1", 4, seed=seed) for seed in (0, 1)]
    for seed, envs in enumerate(eight):
        envs.reset(seed=seed)
    assert isinstance(LockstepEnvs(eight).physics, classic_batch.BatchedCartPole)
    assert LockstepEnvs(eight, batched_physics=False).physics is None


def test_a_cartpole_population_on_batched_physics_logs_what_it_logs_without_and_resumes_exactly(monkeypatch, tmp_path):
    assert_batched_population_logs_what_it_logs_without("CartPole", classic_batch, "BatchedCartPole", monkeypatch,
                                                         tmp_path)


# What the batch relies on beyond +, -, * and /, which round alike on arrays and on numbers: numpy's cos and sin of
# an array give what they give of each number (its SIMD loops for arrays, on the CPU's widest kernels in native mode)
SAME_COS_AND_SIN = """
import benchmarks, numpy as np
angles = np.random.default_rng(0).uniform(-1.0, 1.0, 200_000)
for f in (np.cos, np.sin):
    assert np.array_equal(f(angles), [f(angle) for angle in angles]), f.__name__
"""


@pytest.mark.parametrize("mode", numerics.MODES)
def test_numpys_cos_and_sin_of_an_array_are_those_of_each_number_in_either_numerics_mode(mode):
    child = subprocess.run([sys.executable, "-c", SAME_COS_AND_SIN], cwd=ROOT, env=numerics.environment_for(mode),
                           capture_output=True, text=True)
    assert child.returncode == 0, child.stderr
