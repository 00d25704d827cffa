"""Snapshot and restore of a vector env mid-episode, so a resumed run steps exactly like an uninterrupted one.

Everything is stored as tensors and plain Python values: a checkpoint
holding it loads with torch.load(weights_only=True).

What a sub-env's future depends on, and where it lives:
- the task's own RNG (np_random): start states of later episodes;
- the task's physical state: MuJoCo's mjData buffers, or the plain attributes
  of a classic-control env (CartPole.state, Pendulum.last_u, ...);
- the wrappers' counters: TimeLimit's elapsed steps, OrderEnforcing's flag;
- the vector env's autoreset flags and RecordEpisodeStatistics' running sums.

MuJoCo: mjData holds, besides the integration state, quantities derived at
the start of the last substep (body positions, ...) that Ant, Humanoid,
Reacher and Pusher read *before* their next step. Restoring only qpos/qvel
would shift their first reward after a resume, so every fixed-size mjData
buffer is copied back. The constraint arrays (efc_*, contacts) change size
every step and are rebuilt from scratch by the next mj_step.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch


def _to_stored(value):
    """numpy -> tensor (weights_only-safe), recursively; plain values unchanged."""
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.copy())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: _to_stored(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_stored(v) for v in value)
    return value


def _from_stored(value):
    """The inverse of _to_stored for what setattr puts back: tensors become writable numpy arrays."""
    return value.numpy().copy() if isinstance(value, torch.Tensor) else value


def _from_stored_tree(value):
    """_from_stored through dicts and lists (a state_dict() stored by _to_stored)."""
    if isinstance(value, dict):
        return {k: _from_stored_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_from_stored_tree(v) for v in value)
    return _from_stored(value)


def _plain(value) -> bool:
    return value is None or isinstance(value, (bool, int, float, np.ndarray, np.generic)) or (
        isinstance(value, tuple) and all(isinstance(v, (int, float)) for v in value))


def numpy_rng_state(rng: np.random.Generator) -> dict:
    return rng.bit_generator.state  # ints only (PCG64's are 128-bit Python ints; weights_only loads them)


def _mjdata_arrays(data) -> dict[str, np.ndarray]:
    return {name: getattr(data, name) for name in dir(data)
            if not name.startswith("_") and isinstance(getattr(data, name), np.ndarray)}


def _fixed_size_buffers(model) -> list[str]:
    """mjData arrays sized by the model alone. The others live in mjData's arena
    (constraints, contacts, islands): empty in a fresh mjData, resized and
    rebuilt from scratch by every mj_step."""
    import mujoco

    return sorted(name for name, array in _mjdata_arrays(mujoco.MjData(model)).items() if array.size > 0)


def _mujoco_state(env) -> dict:
    arrays = _mjdata_arrays(env.data)
    return {"arrays": {name: torch.from_numpy(arrays[name].copy()) for name in _fixed_size_buffers(env.model)},
            "time": float(env.data.time)}


def _load_mujoco_state(env, state: dict) -> None:
    data = env.data
    for name, stored in state["arrays"].items():
        target = getattr(data, name)
        if target.shape != tuple(stored.shape):
            raise ValueError(f"mjData.{name} has shape {target.shape}, checkpoint has {tuple(stored.shape)}")
        target[...] = stored.numpy()
    data.time = state["time"]


def _is_mujoco(env) -> bool:
    return hasattr(env, "data") and hasattr(env, "model") and type(env).__module__.startswith("gymnasium.envs.mujoco")


def sub_env_state(env: gym.Env) -> dict:
    """One wrapped sub-env: its wrappers' counters, its task's RNG and physical state."""
    wrappers = []
    layer = env
    while isinstance(layer, gym.Wrapper):
        wrappers.append({k: _to_stored(v) for k, v in vars(layer).items()
                         if k in ("_elapsed_steps", "_has_reset")})
        layer = layer.env
    task = layer
    if _is_mujoco(task):
        physics = {"mujoco": _mujoco_state(task)}
    else:
        physics = {"attributes": {k: _to_stored(v) for k, v in vars(task).items()
                                  if not k.startswith("_") and _plain(v)}}
    return {"wrappers": wrappers, "np_random": numpy_rng_state(task.np_random), **physics}


def load_sub_env_state(env: gym.Env, state: dict) -> None:
    layer, index = env, 0
    while isinstance(layer, gym.Wrapper):
        for key, value in state["wrappers"][index].items():
            setattr(layer, key, value)
        layer, index = layer.env, index + 1
    task = layer
    task.np_random.bit_generator.state = state["np_random"]
    if "mujoco" in state:
        _load_mujoco_state(task, state["mujoco"])
    else:
        for key, value in state["attributes"].items():
            setattr(task, key, _from_stored(value))


def _vector_layers(envs: gym.vector.VectorEnv) -> list:
    layers = [envs]
    while isinstance(layers[-1], gym.vector.VectorWrapper):
        layers.append(layers[-1].env)
    return layers


# Per vector layer, the attributes the next step reads (RecordEpisodeStatistics' sums, SyncVectorEnv's autoreset flags).
_VECTOR_ATTRIBUTES = ("episode_count", "episode_returns", "episode_lengths", "prev_dones", "_autoreset_envs")


def vector_env_state(envs: gym.vector.VectorEnv) -> dict:
    """SyncVectorEnv: each sub-env's state read off its layers; a vector env of its own (the token envs of
    benchmarks/rlhf/env.py) says what its state is with state_dict()."""
    layers = _vector_layers(envs)
    base = layers[-1]
    stored = {"layers": [{k: _to_stored(getattr(layer, k)) for k in _VECTOR_ATTRIBUTES if k in vars(layer)}
                         for layer in layers]}
    if isinstance(base, gym.vector.SyncVectorEnv):
        return {**stored, "sub_envs": [sub_env_state(env) for env in base.envs]}
    if hasattr(base, "state_dict"):
        return {**stored, "own": _to_stored(base.state_dict())}
    raise TypeError(f"{type(base).__name__} cannot be checkpointed: a SyncVectorEnv or a vector env with state_dict()")


def load_vector_env_state(envs: gym.vector.VectorEnv, state: dict) -> None:
    layers = _vector_layers(envs)
    base = layers[-1]
    if len(layers) != len(state["layers"]) or ("own" in state) != (not isinstance(base, gym.vector.SyncVectorEnv)) \
            or ("own" not in state and len(base.envs) != len(state["sub_envs"])):
        raise ValueError("the checkpoint's env layout differs from this run's (num_envs or wrappers changed)")
    for layer, stored in zip(layers, state["layers"]):
        for key, value in stored.items():
            setattr(layer, key, _from_stored(value))
    if "own" in state:
        base.load_state_dict(_from_stored_tree(state["own"]))
        return
    for env, stored in zip(base.envs, state["sub_envs"]):
        load_sub_env_state(env, stored)
