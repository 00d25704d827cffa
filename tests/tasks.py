"""Tasks a user might bring, registered for the probes (tests/test_probes.py) as `env.id=tests.tasks:<Id>`: a plain
one, one whose observations are empty, five whose actions the suite's policies cannot emit, four that break
Gymnasium's API, one that cannot be made, one that fails mid-run, four whose rewards or observations turn NaN and
one whose episodes never end."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class Line(gym.Env):
    """A point on a line pushed left or right; episodes of `episode_steps` steps (None: they never end)."""

    def __init__(self, action_space: gym.Space | None = None, fail_at_step: int | None = None,
                 nan_reward_at_step: int | None = None, nan_observation_at_step: int | None = None,
                 episode_steps: int | None = 20, nan_for_seed: int | None = None):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = action_space or gym.spaces.Discrete(2)
        self.fail_at_step, self.steps, self.episode_steps = fail_at_step, 0, episode_steps
        self.nan_reward_at_step, self.nan_observation_at_step = nan_reward_at_step, nan_observation_at_step
        self.nan_for_seed, self.first_seed = nan_for_seed, None  # nan_for_seed: the NaNs only in an env of that seed

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.first_seed is None:
            self.first_seed = seed
        self.position, self.t = 0.0, 0
        return self.observation(), {}

    def step(self, action):
        self.steps += 1
        if self.fail_at_step is not None and self.steps >= self.fail_at_step:
            raise gym.error.Error(f"the simulator lost its connection at step {self.steps}")
        self.position += 1.0 if np.asarray(action).sum() > 0 else -1.0
        self.t += 1
        poisoned = self.nan_for_seed is None or self.first_seed == self.nan_for_seed
        reward = float("nan") if poisoned and self.steps == self.nan_reward_at_step else -abs(self.position)
        observation = self.observation()
        if self.steps == self.nan_observation_at_step:
            observation[0] = np.nan
        return observation, reward, False, self.episode_steps is not None and self.t >= self.episode_steps, {}

    def observation(self) -> np.ndarray:
        return np.array([self.position, self.t], np.float32)


class Blind(Line):
    """The line with nothing to observe: observations of shape (0,)."""

    def __init__(self):
        super().__init__()
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (0,), np.float32)

    def observation(self) -> np.ndarray:
        return np.zeros(0, np.float32)


class OldGymLine(Line):
    """The line written for the old gym API: step returns (observation, reward, done, info)."""

    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        return observation, reward, terminated or truncated, info


class MisshapenLine(Line):
    """The line whose observations have three numbers where its space says two."""

    def observation(self) -> np.ndarray:
        return np.zeros(3, np.float32)


class PairRewardLine(Line):
    """The line whose step returns two rewards (one per objective) where Gymnasium's API has one number."""

    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        return observation, np.array([reward, -reward]), terminated, truncated, info


def unbuildable():
    raise RuntimeError("the task's licence server is not reachable")


gym.register("Line-v0", Line)
gym.register("LineMultiDiscrete-v0", lambda: Line(gym.spaces.MultiDiscrete([2, 3])))
gym.register("LineBoxMatrix-v0", lambda: Line(gym.spaces.Box(-1.0, 1.0, (2, 2), np.float32)))
gym.register("LineFromOne-v0", lambda: Line(gym.spaces.Discrete(2, start=1)))
gym.register("LineIntegerBox-v0", lambda: Line(gym.spaces.Box(0, 10, (3,), np.int64)))
gym.register("LineNoActions-v0", lambda: Line(gym.spaces.Box(-1.0, 1.0, (0,), np.float32)))
gym.register("Blind-v0", Blind)
gym.register("LineOldGym-v0", OldGymLine)
gym.register("LineOldGymTimed-v0", OldGymLine, max_episode_steps=100)  # its TimeLimit unpacks the step itself
gym.register("LineMisshapen-v0", MisshapenLine)
gym.register("LinePairReward-v0", PairRewardLine)
gym.register("Unbuildable-v0", unbuildable)
gym.register("LineFailsMidRun-v0", lambda: Line(fail_at_step=300))
gym.register("LineNaNReward-v0", lambda: Line(nan_reward_at_step=200))
# CartPole's rollout of 128 rows holds 122 steps of these 20-step episodes (a reset row after each)
gym.register("LineNaNRewardInSeed0-v0", lambda: Line(nan_reward_at_step=200, nan_for_seed=0))  # a population's seed 0
gym.register("LineNaNObservation-v0", lambda: Line(nan_observation_at_step=100))
gym.register("LineNaNLastObservation-v0", lambda: Line(nan_observation_at_step=122))
gym.register("LineNeverEnds-v0", lambda: Line(episode_steps=None))  # no time limit: its episodes never end
