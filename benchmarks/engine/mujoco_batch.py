"""Every seed's MuJoCo physics in one call: mujoco.batch.Batch steps all sub-envs of a population in C.

Gymnasium steps each MuJoCo sub-env on its own: a Python call through its wrappers, `mj_step`
frame_skip times, then the task's observation, reward and termination from qpos and qvel. For the
locomotion tasks whose step reads nothing else - HalfCheetah, Hopper, Walker2d and Swimmer, v5 -
`BatchedLocomotion` does the same for all [seeds x envs] sub-envs at once: one `Batch.step` (each
simulation keeps its whole MjData, solver warm start included), then the task's arithmetic of
Gymnasium v5's `step` on [rows, ...] arrays, in the same order and dtypes, so that every number is
the one Gymnasium gives (tests/test_mujoco_batch.py checks thousands of steps bit for bit, resets
included). Parameters (reward weights, healthy ranges, frame skip, the model itself) are read from
the sub-envs, so `env.kwargs` apply.

What stays Gymnasium's: resets (the sub-env's own `reset()`: its random stream draws the start
state, which is then copied into the batch) and checkpoints (`store` writes the batch's simulations
back into the sub-envs' MjData, which benchmarks/engine/env_state.py saves as for any run). Any
other task, or a sub-env with a wrapper of its own, keeps Gymnasium's per-env step: Ant and
Humanoid read contact forces (`mj_rnePostConstraint`), others positions derived before the step.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from benchmarks.engine.envs import one_task_under_neutral_wrappers


@dataclass(frozen=True)
class Locomotion:
    """How one v5 task turns (qpos before, qpos, qvel, action) into its step's numbers."""

    skipped_positions: int  # leading qpos entries left out of the observation (x; Swimmer: x and y)
    velocity_clip: float | None  # Hopper and Walker2d clip qvel to +-10 in the observation
    health: str | None  # the healthy-state rule: "hopper", "walker" or None (never terminates)


def _tasks() -> dict[type, Locomotion]:
    from gymnasium.envs.mujoco.half_cheetah_v5 import HalfCheetahEnv
    from gymnasium.envs.mujoco.hopper_v5 import HopperEnv
    from gymnasium.envs.mujoco.swimmer_v5 import SwimmerEnv
    from gymnasium.envs.mujoco.walker2d_v5 import Walker2dEnv

    return {HalfCheetahEnv: Locomotion(1, None, None), HopperEnv: Locomotion(1, 10.0, "hopper"),
            Walker2dEnv: Locomotion(1, 10.0, "walker"), SwimmerEnv: Locomotion(2, None, None)}


# MjData's fields that mjSTATE_INTEGRATION holds: with them a simulation continues exactly as it would have
INTEGRATION_STATE = ("time", "qpos", "qvel", "act", "history", "qacc_warmstart", "ctrl", "qfrc_applied", "xfrc_applied",
                     "eq_active", "mocap_pos", "mocap_quat", "userdata", "plugin_state", "plastic")


def batchable(sub_envs: list[list[gym.Env]]) -> bool:
    """Whether every sub-env is one supported task, of one class and one set of arguments, under only the neutral
    wrappers, with a TimeLimit, and this MuJoCo has mujoco.batch (3.17 on)."""
    if importlib.util.find_spec("mujoco.batch") is None:
        return False
    return one_task_under_neutral_wrappers(sub_envs, tuple(_tasks()))


class BatchedLocomotion:
    """The physics of sub_envs[seed][env], row seed * num_envs + env of one persistent mujoco.batch.Batch."""

    gains_from = 4  # sub-envs: below, the batch gains nothing over Gymnasium's step (results/tables/batched_physics.md)

    def __init__(self, sub_envs: list[list[gym.Env]], threads: int = 1):
        import mujoco.batch

        self.tasks = [env.unwrapped for row in sub_envs for env in row]
        self.task = task = self.tasks[0]  # every row's arguments (batchable checked they are one set)
        self.rule = _tasks()[type(task)]
        self.frame_skip, self.dt = task.frame_skip, task.dt
        self.forward_weight, self.ctrl_weight = task._forward_reward_weight, task._ctrl_cost_weight
        if not task._exclude_current_positions_from_observation:
            self.rule = Locomotion(0, self.rule.velocity_clip, self.rule.health)
        self.batch = mujoco.batch.Batch(task.model, len(self.tasks), nthread=threads, persistent=True)
        # the integration state (mjSTATE_INTEGRATION's fields) as live [rows, ...] views; ctrl is among them
        self.state = {name: self.batch.bind(name) for name in INTEGRATION_STATE if self.batch.bind(name).size > 0}
        self.qpos, self.qvel, self.ctrl = self.state["qpos"], self.state["qvel"], self.state["ctrl"]
        # MuJoCo says an instability warning the first time it counts one; a reset (mj_resetData) zeroes the counts
        self.warnings = self.batch.warning  # live [rows, mjNWARNING, (lastinfo, number)]

    def load(self, rows) -> None:
        """Copy sub-envs' MjData state and warning counts into their rows (after a reset, and when the env layer
        starts or resumes)."""
        for row in rows:
            data = self.tasks[row].data
            for name, view in self.state.items():
                view[row] = getattr(data, name)
            self.warnings[row] = [(warning.lastinfo, warning.number) for warning in data.warning]

    def store(self) -> None:
        """Write every row's whole MjData back into its sub-env (before a checkpoint reads them)."""
        for row, task in enumerate(self.tasks):
            self.batch.get_data(row, data=task.data)

    def step(self, rows: np.ndarray | None, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Step the given rows (None: all) with their (clipped) actions [rows, action_dim]: observations, rewards and
        terminations of those rows, as each sub-env's own step() returns them. MuJoCo's instability warnings
        reach the suite's handler (benchmarks/engine/envs.py) and the simulation resets itself, as in mj_step."""
        every_row = rows is None
        x_before = self.qpos[:, 0].copy() if every_row else self.qpos[rows, 0]
        if every_row:  # the common case, without indexing
            self.ctrl[:] = actions
            self.batch.step(nstep=self.frame_skip)
            qpos, qvel = self.qpos, self.qvel
        else:
            self.ctrl[rows] = actions
            self.batch.step(ids=rows, nstep=self.frame_skip)
            qpos, qvel = self.qpos[rows], self.qvel[rows]
        x_velocity = (qpos[:, 0] - x_before) / self.dt
        velocity = qvel if self.rule.velocity_clip is None else np.clip(qvel, -self.rule.velocity_clip,
                                                                         self.rule.velocity_clip)
        observations = np.concatenate((qpos[:, self.rule.skipped_positions:], velocity), axis=1)
        forward_reward = self.forward_weight * x_velocity
        ctrl_cost = self.ctrl_weight * np.sum(np.square(actions), axis=1)
        if self.rule.health is None:
            return observations, forward_reward - ctrl_cost, np.zeros(len(observations), dtype=bool)
        healthy = self.healthy(qpos, qvel)
        rewards = forward_reward + healthy * self.task._healthy_reward
        terminated = ~healthy & bool(self.task._terminate_when_unhealthy)
        return observations, rewards - ctrl_cost, terminated

    def healthy(self, qpos: np.ndarray, qvel: np.ndarray) -> np.ndarray:
        """Hopper's and Walker2d's is_healthy, per row."""
        task = self.task
        (min_z, max_z), (min_angle, max_angle) = task._healthy_z_range, task._healthy_angle_range
        z, angle = qpos[:, 1], qpos[:, 2]
        healthy = (min_z < z) & (z < max_z) & (min_angle < angle) & (angle < max_angle)
        if self.rule.health == "hopper":  # also every entry of state_vector()[2:] within its range
            min_state, max_state = task._healthy_state_range
            state = np.concatenate((qpos, qvel), axis=1)[:, 2:]
            healthy &= np.all((min_state < state) & (state < max_state), axis=1)
        return healthy
