"""Task config -> Gymnasium vector env with the wrappers every algorithm shares."""

from __future__ import annotations

import importlib
import sys

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

_MUJOCO_WARNINGS_SEEN: set[str] = set()


def mujoco_warning(message: str) -> None:
    """MuJoCo's warnings, each said once on stderr (MuJoCo's own handler prints every one and appends it to
    MUJOCO_LOG.TXT in the working directory). Left out: the deprecation of the `settotalmass` compiler
    attribute, which Gymnasium's own HalfCheetah model uses - MuJoCo says it at every model compile, 3-11
    times a run, about a file in the library, not in this suite or the user's task."""
    if "'settotalmass' is deprecated" in message or message in _MUJOCO_WARNINGS_SEEN:
        return
    _MUJOCO_WARNINGS_SEEN.add(message)
    print(f"mujoco warning: {message}", file=sys.stderr)


def install_mujoco_warning_handler() -> None:
    import mujoco

    if mujoco.get_mju_user_warning() is None:
        mujoco.set_mju_user_warning(mujoco_warning)


class DropStepInfo(gym.Wrapper):
    """Returns an empty info from step().

    Nothing here reads the tasks' own step info (MuJoCo's x_position,
    reward_ctrl, ...), and SyncVectorEnv merges every key of it into per-env
    arrays on every step (`python -m benchmarks.speed.env_overhead` measures what
    that costs). Episode statistics come from
    RecordEpisodeStatistics, outside the vector env, and are unaffected.
    """

    def step(self, action):
        obs, reward, terminated, truncated, _ = self.env.step(action)
        return obs, reward, terminated, truncated, {}


# the wrappers gym.make and make_vector_env put around a task: none of them changes a step's numbers
NEUTRAL_WRAPPERS = (gym.wrappers.TimeLimit, gym.wrappers.OrderEnforcing, gym.wrappers.PassiveEnvChecker, DropStepInfo)


def one_task_under_neutral_wrappers(sub_envs: list[list[gym.Env]], tasks: tuple[type, ...]) -> bool:
    """Whether every sub-env is one of `tasks`, all of one class and one set of arguments, under only the neutral
    wrappers, with a TimeLimit: what a batched step of their physics (benchmarks/engine/mujoco_batch.py,
    classic_batch.py) may stand in for."""
    kinds, arguments = set(), set()
    for env in (env for row in sub_envs for env in row):
        arguments.add(repr(sorted((env.spec.kwargs if env.spec is not None else {}).items())))
        layer, limited = env, False
        while isinstance(layer, gym.Wrapper):
            if type(layer) not in NEUTRAL_WRAPPERS:
                return False
            limited |= isinstance(layer, gym.wrappers.TimeLimit)
            layer = layer.env
        kinds.add(type(layer))
        if not limited:
            return False
    return len(kinds) == 1 and next(iter(kinds)) in tasks and len(arguments) == 1


def time_limit(env: gym.Env) -> gym.wrappers.TimeLimit | None:
    layer = env
    while isinstance(layer, gym.Wrapper):
        if isinstance(layer, gym.wrappers.TimeLimit):
            return layer
        layer = layer.env
    return None


def find_spec(env_id: str) -> gym.envs.registration.EnvSpec:
    """gym.spec, also for Gymnasium's "module:Env-v0" form (the module registers the id when imported)."""
    if ":" in env_id:
        module, env_id = env_id.split(":", 1)
        importlib.import_module(module)
    return gym.spec(env_id)


def make_vector_env(env_id: str, num_envs: int, seed: int, record_stats: bool = True,
                    env_kwargs: dict | None = None) -> gym.vector.VectorEnv:
    """SyncVectorEnv in NEXT_STEP autoreset mode (Gymnasium 1.x default, made explicit).

    Sync, not async: on 2 cores 8 async processes ran at less than half the
    speed of one sync process (8 x HalfCheetah-v5, measured). Continuous actions are clipped to
    the bounds on their way into the env only; the unclipped sample is what
    the algorithm stores and scores. A task registered only as a vector env (the token tasks,
    benchmarks/rlhf/env.py, which step all their sequences in one batched call) is made by its
    vector entry point instead. env_kwargs (env.kwargs) are the task's own arguments.
    """
    if find_spec(env_id).entry_point is None:  # registered only as a vector env
        envs = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **(env_kwargs or {}))
    else:
        install_mujoco_warning_handler()
        envs = gym.make_vec(
            env_id,
            num_envs=num_envs,
            vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": AutoresetMode.NEXT_STEP},
            wrappers=[DropStepInfo],
            disable_env_checker=True,  # the passive checker wraps every step; the tasks are Gymnasium's own
            **(env_kwargs or {}),
        )
    if record_stats:
        envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    if isinstance(envs.single_action_space, gym.spaces.Box):
        envs = clip_actions(envs)
    envs.action_space.seed(seed)
    return envs


def clip_actions(envs: gym.vector.VectorEnv) -> gym.vector.VectorEnv:
    """Clip a Box action batch to the bounds with one np.clip over [num_envs, ...].

    Gymnasium's vector ClipAction applies the single-env wrapper env by env
    (iterate + concatenate): same numbers, more time per step
    (`python -m benchmarks.speed.env_overhead`).
    """
    low, high = envs.single_action_space.low, envs.single_action_space.high
    return gym.wrappers.vector.TransformAction(envs, lambda actions: np.clip(actions, low, high))


class UnsupportedTaskError(gym.error.Error):
    """A task whose spaces the suite's networks cannot read: refused in one line, as an unknown id is."""


def space_problem(env_id: str, obs_space: gym.Space, action_space: gym.Space) -> str | None:
    """Why the suite's MLP policies cannot train on these spaces (one line), or None: they read a flat Box
    observation and act in a Discrete space from 0 or a flat Box of floats."""
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1 or obs_space.shape[0] == 0:
        return (f"env.id={env_id}: its observation space {obs_space} is not supported: the suite's networks read "
                f"one flat vector of numbers per step (a Box of shape (n,), n >= 1); a task of your own can flatten it "
                f"(gymnasium.wrappers.FlattenObservation, registered as module:Id: docs/extending.md)")
    # the policies emit 0..n-1 (a Discrete space starting elsewhere would be off by its start) or floats
    from_zero = isinstance(action_space, gym.spaces.Discrete) and int(action_space.start) == 0
    flat_box = (isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1
                and action_space.shape[0] > 0 and np.issubdtype(action_space.dtype, np.floating))
    if not (from_zero or flat_box):
        return (f"env.id={env_id}: its action space {action_space} is not supported: the suite's policies act in a "
                f"Discrete space starting at 0 or a Box of floats of shape (n,), n >= 1")
    return None


def space_dims(envs: gym.vector.VectorEnv, env_id: str) -> tuple[int, int, bool, tuple]:
    """(obs_dim, action_dim, discrete, stored action shape) of a task whose spaces the policies read."""
    obs_space, action_space = envs.single_observation_space, envs.single_action_space
    problem = space_problem(env_id, obs_space, action_space)
    if problem is not None:
        raise UnsupportedTaskError(problem)
    obs_dim = int(obs_space.shape[0])
    if isinstance(action_space, gym.spaces.Discrete):
        return obs_dim, int(action_space.n), True, ()
    return obs_dim, int(action_space.shape[0]), False, tuple(action_space.shape)
