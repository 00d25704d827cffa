"""Batched CartPole (benchmarks/engine/classic_batch.py): every seed's sub-envs stepped as numpy arrays give, bit
for bit, what Gymnasium's own CartPole gives - states, observations, rewards, terminations, truncations, resets,
episode statistics and the state a checkpoint saves - over thousands of steps, falls and time limits; a
population trained, paused and resumed on it logs what it logs without it."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from benchmarks import numerics
from benchmarks.engine import batch_trainer, classic_batch
from benchmarks.engine.batch_trainer import LockstepEnvs
from benchmarks.engine.env_state import vector_env_state
from tests.conftest import ROOT
from tests.test_mujoco_batch import SEEDS, assert_batched_population_logs_what_it_logs_without, lockstep, resumed, \
    step_both_alike

NUM_ENVS = 4  # 3 seeds x 4 envs: 12 rows, past the default's 8 and past one 8-wide vector of float64


def balancing_actions(envs: LockstepEnvs, rng: np.random.Generator, skill: float) -> np.ndarray:
    """Push towards the pole's fall (long episodes, up to the time limit) with probability `skill`, else at random."""
    theta, theta_dot = envs.raw_obs[..., 2], envs.raw_obs[..., 3]
    push = (theta + 0.5 * theta_dot > 0).astype(np.int64)
    return np.where(rng.random(push.shape) < skill, push, rng.integers(0, 2, push.shape))


def assert_same_saved_state(a, b, where: str) -> None:
    """Two checkpoints' env states (nested dicts and lists of tensors and plain values) equal, bit for bit."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same_saved_state(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for index, (x, y) in enumerate(zip(a, b)):
            assert_same_saved_state(x, y, f"{where}[{index}]")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    else:
        assert type(a) is type(b) and a == b, where


@pytest.mark.parametrize("kwargs, integrator", [({}, "euler"), ({"sutton_barto_reward": True}, "euler"),
                                                ({}, "semi-implicit")])
def test_batched_cartpole_steps_bit_for_bit_as_gymnasium(kwargs, integrator):
    def made(batched: bool | None) -> LockstepEnvs:
        layer = lockstep("CartPole-v1", batched, NUM_ENVS, **kwargs)
        for row in layer.sub_envs:  # the integrator is an attribute, not an argument of the task
            for env in row:
                env.unwrapped.kinematics_integrator = integrator
        return layer

    gymnasium, batched = made(False), made(True)
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
        if t in (1233, 4320):  # mid-episode: what a checkpoint saves, then a resume into new envs
            gymnasium.to_layers()
            batched.to_layers()
            for seed in range(SEEDS):
                assert_same_saved_state(vector_env_state(batched.vector_envs[seed]),
                                        vector_env_state(gymnasium.vector_envs[seed]), f"t={t} seed {seed}")
            batched = resumed(batched, "CartPole-v1", **kwargs)
            for row in batched.sub_envs:
                for env in row:
                    env.unwrapped.kinematics_integrator = integrator
            assert isinstance(batched.physics, classic_batch.BatchedCartPole)
        falls += int(gymnasium.terminated.sum())
        time_limits += int((gymnasium.truncated & ~gymnasium.terminated).sum())
    assert falls >= 100 and time_limits >= 6


@pytest.mark.parametrize("sutton_barto_reward", [False, True])
def test_a_sub_env_stepped_after_its_fall_gets_gymnasiums_reward_and_count(sutton_barto_reward):
    """The autoreset never steps a fallen pole, but the batch keeps Gymnasium's rule for it - the reward and the
    count of steps beyond the fall - and stores the count back into the sub-env for its checkpoint."""
    envs = lockstep("CartPole-v1", True, sutton_barto_reward=sutton_barto_reward)
    physics, task = envs.physics, envs.physics.tasks[0]
    alone = CartPoleEnv(sutton_barto_reward=sutton_barto_reward)
    alone.reset(seed=0)
    alone.state = physics.state[0] = np.array([0.0, 0.0, 0.25, 0.0])  # beyond 12 degrees: every step ends it
    for step in range(4):
        obs, reward, terminated, _, _ = alone.step(1)
        observations, rewards, ended = physics.step(np.array([0]), np.array([1]))
        assert ended[0] == terminated and rewards[0] == reward and np.array_equal(observations[0], obs), step
        assert physics.steps_beyond[0] == alone.steps_beyond_terminated == step
    physics.store()
    assert task.steps_beyond_terminated == 3 and np.array_equal(task.state, alone.state)
    task.reset(seed=1)
    physics.load([0])
    assert physics.steps_beyond[0] == -1 and np.array_equal(physics.state[0], task.state)


@pytest.mark.parametrize("actions", [[[1, 0], [0, 2]], [[1, 0], [3, 2]], [[1.0, 0.0], [1.0, 0.0]],
                                     [[0, 1], [-1, 1]], np.ones((2, 2), dtype=np.uint64), np.ones((2, 2), dtype=bool),
                                     [[7, 7], [1, 0]]])  # the last: only in the stopped seed, so never stepped
def test_an_action_outside_the_space_fails_as_on_gymnasiums_step(actions):
    """A variant whose policy gives CartPole an action it does not have stops with Gymnasium's own error, naming
    the same first action of the stepped seeds, batched or not, instead of training on a push it never chose."""
    actions = np.asarray(actions)
    outcomes = []
    for batched in (False, True):
        vector_envs = [batch_trainer.make_vector_env("CartPole-v1", 2, seed=seed) for seed in range(2)]
        for seed, envs in enumerate(vector_envs):
            envs.reset(seed=seed)
        try:  # seed 0 stopped: its envs are not stepped, whatever its actions
            LockstepEnvs(vector_envs, batched_physics=batched).step(actions, np.array([False, True]))
            outcomes.append(None)
        except AssertionError as error:
            outcomes.append(str(error))
    assert outcomes[1] == outcomes[0], outcomes
    assert (outcomes[0] is None) == (actions[0, 0] == 7), outcomes


def test_what_the_batch_cannot_stand_for_keeps_gymnasiums_step():
    def sub_envs(**kwargs):
        return [LockstepEnvs.layer(batch_trainer.make_vector_env("CartPole-v1", 2, seed=s, env_kwargs=kwargs),
                                   gym.vector.SyncVectorEnv).envs for s in range(2)]

    plain = sub_envs()
    assert classic_batch.batchable(plain)
    assert not classic_batch.batchable([plain[0], [gym.wrappers.ClipReward(plain[1][0], 0, 0.5), plain[1][1]]])
    assert not classic_batch.batchable([plain[0], sub_envs(sutton_barto_reward=True)[0]])  # arguments differ
    assert not classic_batch.batchable(sub_envs(render_mode="rgb_array"))  # every sub-env renders alike
    heavier = sub_envs()
    heavier[1][0].unwrapped.force_mag = 20.0  # a constant set on one env, not through its arguments
    assert not classic_batch.batchable(heavier)
    wider = sub_envs()
    wider[0][1].unwrapped.action_space = gym.spaces.Discrete(3)  # the action check reads the space
    assert not classic_batch.batchable(wider)

    class Tilted(CartPoleEnv):  # a task of its own built on CartPole: its step may be another
        pass

    tilted = [[gym.wrappers.TimeLimit(Tilted(), 500) for _ in range(2)]]
    assert not classic_batch.batchable(tilted)
    assert lockstep("Acrobot-v1", True).physics is None
    # by default from 8 sub-envs on, where the batch measured faster than Gymnasium's per-env calls
    for num_envs, batched in ((7, False), (8, True)):
        envs = batch_trainer.make_vector_env("CartPole-v1", num_envs, seed=0)
        envs.reset(seed=0)
        assert isinstance(LockstepEnvs([envs]).physics, classic_batch.BatchedCartPole) == batched, num_envs
        assert LockstepEnvs([envs], batched_physics=False).physics is None


def test_a_cartpole_population_on_batched_physics_logs_what_it_logs_without_and_resumes_exactly(monkeypatch, tmp_path):
    assert_batched_population_logs_what_it_logs_without("CartPole", classic_batch, "BatchedCartPole", monkeypatch,
                                                         tmp_path)


# What the batch relies on beyond +, -, * and /, which round alike on arrays and on numbers: numpy's cos and sin of
# the state's columns (strided views, and rows picked by index) give what they give of each number, whatever SIMD
# loops numpy runs for arrays (the CPU's widest kernels in native mode)
SAME_COS_AND_SIN = """
import benchmarks, numpy as np
states = np.random.default_rng(0).uniform(-1.0, 1.0, (50_000, 4))
picked = np.flatnonzero(np.arange(50_000) % 3 != 1)
for f in (np.cos, np.sin):
    for angles in (states[:, 2], states[picked, 2], np.ascontiguousarray(states[:, 2])):
        assert np.array_equal(f(angles), [f(angle) for angle in angles]), f.__name__
"""


@pytest.mark.parametrize("mode", numerics.MODES)
def test_numpys_cos_and_sin_of_an_array_are_those_of_each_number_in_either_numerics_mode(mode):
    child = subprocess.run([sys.executable, "-c", SAME_COS_AND_SIN], cwd=ROOT, env=numerics.environment_for(mode),
                           capture_output=True, text=True)
    assert child.returncode == 0, child.stderr
