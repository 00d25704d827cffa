"""Learning reference: Stable-Baselines3 PPO trained with this suite's PPO hyperparameters.

    python -m benchmarks.speed.sb3_reference --env CartPole --steps 100000 --seeds 0 1 2 3 4

Same env, rollout, epochs, minibatch size, lr schedule, network and
normalisation as `python run.py algo=ppo env=<env>`; the final deterministic
evaluation (10 episodes, frozen normalisation) is printed per seed. It tells
apart "this suite's PPO is slow" from "these hyperparameters are slow".
Benchmark-only: needs `pip install -e .[bench]`.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from benchmarks.speed.throughput import benchmark_config, sb3_model
from benchmarks.arguments import conf_name


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="CartPole", type=conf_name("env"))
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--episodes", type=int, default=10)
    args = parser.parse_args(argv)
    from stable_baselines3.common.evaluation import evaluate_policy

    torch.set_num_threads(1)
    finals = []
    for seed in args.seeds:
        cfg = benchmark_config(args.env, "ppo", [f"seed={seed}"], args.steps)
        model = sb3_model(cfg)
        model.learn(total_timesteps=args.steps)
        env = model.get_env()
        if hasattr(env, "training"):  # VecNormalize: freeze statistics, report raw rewards
            env.training, env.norm_reward = False, False
        mean, _ = evaluate_policy(model, env, n_eval_episodes=args.episodes, deterministic=True)
        finals.append(mean)
        print(f"seed {seed}: final deterministic eval {mean:.2f} after {model.num_timesteps} steps", flush=True)
    print(f"SB3 PPO, {args.env}, {args.steps} steps, seeds {args.seeds}: "
          f"{np.mean(finals):.2f} +- {np.std(finals):.2f}")


if __name__ == "__main__":
    main()
