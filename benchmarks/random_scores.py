"""Random-policy return of every task: the zero point of normalised scores.

    python -m benchmarks.random_scores [--episodes 50] [--seed 0] [--tasks Hopper MyTask]

Uniform random actions, `episodes` episodes per task, one env, seeded, the task made with its own
arguments (env.kwargs). Prints one line per task (its conf/env name, mean return, std); the values are
copied into each task's `random_score` in conf/env/*.yaml with this command noted. --tasks: only these
(a task just added); default every conf/env file.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gymnasium as gym
import numpy as np

from benchmarks.arguments import number_in, seed_number

ENV_DIR = Path(__file__).resolve().parents[1] / "conf" / "env"


def random_returns(env_id: str, episodes: int, seed: int, env_kwargs: dict | None = None) -> np.ndarray:
    from benchmarks.engine.envs import find_spec, make_vector_env

    # a task registered only as a vector env (the token tasks) is stepped as a vector env of one
    vector = find_spec(env_id).entry_point is None
    env = (make_vector_env(env_id, 1, seed, record_stats=False, env_kwargs=env_kwargs) if vector
           else gym.make(env_id, **(env_kwargs or {})))
    action_space = env.single_action_space if vector else env.action_space
    action_space.seed(seed)
    returns = []
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            action = action_space.sample()
            _, reward, terminated, truncated, _ = env.step(np.stack([action]) if vector else action)
            total += float(np.sum(reward))
            done = bool(np.any(terminated) or np.any(truncated))
        returns.append(total)
    env.close()
    return np.array(returns)


def main(argv=None) -> None:
    tasks = sorted(path.stem for path in ENV_DIR.glob("*.yaml"))
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=number_in(1, integer=True), default=50)
    parser.add_argument("--seed", type=seed_number, default=0)
    parser.add_argument("--tasks", nargs="+", default=tasks, metavar="NAME", help="conf/env names (default: all)")
    args = parser.parse_args(argv)
    unknown = [name for name in args.tasks if name not in tasks]
    if unknown:
        parser.error(f"argument --tasks: no conf/env/{unknown[0]}.yaml; the tasks: {', '.join(tasks)}")
    from benchmarks.engine.config import compose_config, task_kwargs

    for name in args.tasks:
        env_cfg = compose_config([f"env={name}"]).env  # the task as a run makes it: its family's kwargs too
        returns = random_returns(env_cfg.id, args.episodes, args.seed, task_kwargs(env_cfg))
        print(f"{name:24s} {env_cfg.id:28s} random_score {returns.mean():10.2f}  (std {returns.std():.2f})", flush=True)


if __name__ == "__main__":
    main()
