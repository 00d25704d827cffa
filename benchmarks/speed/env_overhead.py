"""Per-step cost of Gymnasium's vector wrappers around one MuJoCo env.

    python -m benchmarks.speed.env_overhead [--env HalfCheetah-v5] [--steps 3000]

Steps the same random actions through the wrapper stack the trainer uses
(benchmarks.engine.envs.make_vector_env: SyncVectorEnv NEXT_STEP with DropStepInfo,
RecordEpisodeStatistics, one batched action clip), through that stack with one
of its choices undone (Gymnasium's per-env ClipAction, the tasks' step info
merged), with one layer removed at a time, the bare env, and for a MuJoCo task
its physics alone (mj_step over the task's frame skip); best of 3 per variant,
in us/step.
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from benchmarks.engine.envs import DropStepInfo, clip_actions, make_vector_env


def make(env_id: str, copy: bool, drop_info: bool, stats: bool, clip: str | None):
    envs = gym.make_vec(env_id, num_envs=1, vectorization_mode="sync", disable_env_checker=True,
                        vector_kwargs={"autoreset_mode": AutoresetMode.NEXT_STEP, "copy": copy},
                        wrappers=[DropStepInfo] if drop_info else [])
    if stats:
        envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    if clip == "gymnasium":
        envs = gym.wrappers.vector.ClipAction(envs)
    elif clip == "batched":
        envs = clip_actions(envs)
    envs.reset(seed=0)
    return envs


def best_us_per_step(step, actions) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for action in actions:
            step(action)
        best = min(best, (time.perf_counter() - start) / len(actions))
    return 1e6 * best


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--steps", type=int, default=3000)
    args = parser.parse_args(argv)
    probe = gym.make(args.env)
    low, high = probe.action_space.low, probe.action_space.high
    actions = np.random.default_rng(0).uniform(low, high, (args.steps, 1, *low.shape)).astype(np.float32)
    variants = [
        ("+ Gymnasium's ClipAction", {"copy": True, "drop_info": True, "stats": True, "clip": "gymnasium"}),
        ("+ tasks' step info merged", {"copy": True, "drop_info": False, "stats": True, "clip": "batched"}),
        ("- observation copy", {"copy": False, "drop_info": True, "stats": True, "clip": "batched"}),
        ("- RecordEpisodeStatistics", {"copy": False, "drop_info": True, "stats": False, "clip": "batched"}),
        ("- action clip", {"copy": False, "drop_info": True, "stats": False, "clip": None}),
    ]
    trainer_stack = make_vector_env(args.env, num_envs=1, seed=0)
    trainer_stack.reset(seed=0)
    print(f"{'trainer stack':28s} {best_us_per_step(trainer_stack.step, actions):7.1f} us/step")
    for name, options in variants:
        print(f"{name:28s} {best_us_per_step(make(args.env, **options).step, actions):7.1f} us/step")
    bare = probe.unwrapped
    bare.reset(seed=0)
    print(f"{'bare env.step':28s} {best_us_per_step(bare.step, actions[:, 0]):7.1f} us/step")
    if hasattr(bare, "frame_skip"):  # a MuJoCo task: the physics alone, the floor of any env layer on one thread
        import mujoco

        def physics(action):
            bare.data.ctrl[:] = action
            mujoco.mj_step(bare.model, bare.data, nstep=bare.frame_skip)

        print(f"{'physics only (mj_step)':28s} {best_us_per_step(physics, actions[:, 0]):7.1f} us/step")


if __name__ == "__main__":
    main()
