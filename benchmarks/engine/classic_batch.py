"""Every seed's CartPole in one numpy step: the classic-control counterpart of benchmarks/engine/mujoco_batch.py.

Gymnasium steps each CartPole sub-env on its own: a Python call through its wrappers, then the cart-pole
arithmetic on four Python scalars. `BatchedCartPole` does the same arithmetic for all [seeds x envs] sub-envs
at once, on [rows] float64 arrays, in the same order of operations and dtypes as Gymnasium's `CartPoleEnv.step`,
so that every number is the one Gymnasium gives (np.cos and np.sin of an array give, element for element, what
they give of one number; tests/test_classic_batch.py checks thousands of steps bit for bit, resets included).
The task's constants (masses, lengths, force, tau, integrator, thresholds, reward rule) are read from the
sub-envs, so `env.kwargs` apply.

What stays Gymnasium's, as for the MuJoCo tasks: resets (the sub-env's own `reset()` draws the start state from
its random stream; `load` copies it into the batch) and checkpoints (`store` writes each row's state back into
its sub-env, which benchmarks/engine/env_state.py saves as for any run). The sub-env's check that an action is in
its space is made once for all rows, with Gymnasium's verdict and message (and, as Gymnasium's, skipped under
`python -O`); left out is its warning when stepped after its episode ended (the autoreset never does so).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from benchmarks.engine.envs import one_task_under_neutral_wrappers


# what a CartPole step reads of its env besides its state (and its action space): one value each for every row
CONSTANTS = ("gravity", "masscart", "masspole", "total_mass", "length", "polemass_length", "force_mag", "tau",
             "kinematics_integrator", "theta_threshold_radians", "x_threshold", "_sutton_barto_reward")


def batchable(sub_envs: list[list[gym.Env]]) -> bool:
    """Whether every sub-env is Gymnasium's CartPole (not a subclass), of one set of arguments and constants, under
    only the neutral wrappers, rendering nothing (a step renders in human mode, which the batch does not)."""
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv

    if not one_task_under_neutral_wrappers(sub_envs, (CartPoleEnv,)):
        return False
    tasks = [env.unwrapped for row in sub_envs for env in row]
    constants = {(*(getattr(task, name) for name in CONSTANTS), repr(task.action_space), task.action_space.dtype)
                 for task in tasks}
    return len(constants) == 1 and all(task.render_mode is None for task in tasks)


class BatchedCartPole:
    """The state of sub_envs[seed][env] as row seed * num_envs + env of one [rows, 4] array."""

    # sub-envs: the arrays' fixed cost per step outweighs Gymnasium's per-env calls at 4 (0.75x) and not at 8 (1.20x,
    # results/tables/batched_physics_cartpole.md): 8 is the first size measured to gain
    gains_from = 8

    def __init__(self, sub_envs: list[list[gym.Env]]):
        self.tasks = [env.unwrapped for row in sub_envs for env in row]
        self.task = self.tasks[0]  # every row's constants (batchable checked they are one set)
        self.state = np.zeros((len(self.tasks), 4))  # x, x_dot, theta, theta_dot
        # Gymnasium's steps_beyond_terminated: -1 where it is None (the episode has not ended)
        self.steps_beyond = np.full(len(self.tasks), -1)

    def load(self, rows) -> None:
        """Copy sub-envs' state into their rows (after a reset, and when the env layer starts or resumes)."""
        for row in rows:
            task = self.tasks[row]
            self.state[row] = task.state
            self.steps_beyond[row] = -1 if task.steps_beyond_terminated is None else task.steps_beyond_terminated

    def store(self) -> None:
        """Write every row's state back into its sub-env (before a checkpoint reads them)."""
        for row, task in enumerate(self.tasks):
            task.state = self.state[row].copy()
            task.steps_beyond_terminated = None if self.steps_beyond[row] < 0 else int(self.steps_beyond[row])

    def step(self, rows: np.ndarray | None, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Step the given rows (None: all) with their actions [rows] or [rows, 1]: observations, rewards and
        terminations of those rows, as each sub-env's own step() returns them."""
        task = self.task
        actions = actions.reshape(-1)
        if __debug__:  # the sub-env's own check, an assert as in Gymnasium's step: its verdict and its message
            space = task.action_space
            if not (np.issubdtype(actions.dtype, np.integer) and np.can_cast(actions.dtype, space.dtype)
                    and ((actions >= space.start) & (actions < space.start + space.n)).all()):
                invalid = next((action for action in actions if not space.contains(action)), None)
                assert invalid is None, f"{invalid!r} ({type(invalid)}) invalid"
        picked = slice(None) if rows is None else rows
        state = self.state[picked]
        x, x_dot, theta, theta_dot = state[:, 0], state[:, 1], state[:, 2], state[:, 3]
        force = np.where(actions == 1, task.force_mag, -task.force_mag)
        costheta = np.cos(theta)
        sintheta = np.sin(theta)
        temp = (force + task.polemass_length * np.square(theta_dot) * sintheta) / task.total_mass
        thetaacc = (task.gravity * sintheta - costheta * temp) / (
            task.length * (4.0 / 3.0 - task.masspole * np.square(costheta) / task.total_mass))
        xacc = temp - task.polemass_length * thetaacc * costheta / task.total_mass
        if task.kinematics_integrator == "euler":
            x = x + task.tau * x_dot
            x_dot = x_dot + task.tau * xacc
            theta = theta + task.tau * theta_dot
            theta_dot = theta_dot + task.tau * thetaacc
        else:  # semi-implicit euler
            x_dot = x_dot + task.tau * xacc
            x = x + task.tau * x_dot
            theta_dot = theta_dot + task.tau * thetaacc
            theta = theta + task.tau * theta_dot
        state = np.stack((x, x_dot, theta, theta_dot), axis=1)
        terminated = ((x < -task.x_threshold) | (x > task.x_threshold) | (theta < -task.theta_threshold_radians)
                      | (theta > task.theta_threshold_radians))
        # the reward: on its episode's last step as on any other, after it as Gymnasium's "beyond" steps
        beyond = self.steps_beyond[picked]
        ended_before = terminated & (beyond >= 0)
        if task._sutton_barto_reward:
            rewards = np.where(terminated, -1.0, 0.0)
        else:
            rewards = np.where(ended_before, 0.0, 1.0)
        beyond = np.where(ended_before, beyond + 1, np.where(terminated, 0, beyond))
        self.state[picked], self.steps_beyond[picked] = state, beyond
        return state.astype(np.float32), rewards, terminated
