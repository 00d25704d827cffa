"""Random-policy return of every task: the zero point of normalised scores.

    python -m benchmarks.random_scores [--episodes 50] [--seed 0]

Uniform random actions, `episodes` episodes per task, one env, seeded. Prints
one line per task (its conf/env name, mean return, std); the values are copied
into each task's `random_score` in conf/env/*.yaml with this command noted.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gymnasium as gym
import numpy as np
from omegaconf import OmegaConf

from benchmarks.arguments import number_in, seed_number

ENV_DIR = Path(__file__).resolve().parents[1] / "conf" / "env"


def random_returns(env_id: str, episodes: int, seed: int) -> np.ndarray:
    env = gym.make(env_id)
    env.action_space.seed(seed)
    returns = []
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return np.array(returns)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=number_in(1, integer=True), default=50)
    parser.add_argument("--seed", type=seed_number, default=0)
    args = parser.parse_args(argv)
    for path in sorted(ENV_DIR.glob("*.yaml")):
        env_id = OmegaConf.load(path).id
        returns = random_returns(env_id, args.episodes, args.seed)
        print(f"{path.stem:24s} {env_id:28s} random_score {returns.mean():10.2f}  (std {returns.std():.2f})", flush=True)


if __name__ == "__main__":
    main()
