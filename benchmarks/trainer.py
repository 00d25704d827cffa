"""The training loop every algorithm shares: collect -> algorithm.update -> log -> evaluate -> checkpoint.

The trainer never knows which algorithm it drives; the algorithm never
touches envs, files or Hydra.
"""

from __future__ import annotations

import os
import platform
import random
import subprocess
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from algorithms import build_algorithm
from algorithms.core import ObservationNormalizer, RewardScaler, Rollout
from benchmarks.envs import make_vector_env, space_dims
from benchmarks.logger import CSVLog, RunLogger, write_json_atomic

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class Evaluator:
    """K episodes of the deterministic policy on separate envs, with frozen normalisation.

    One sub-env per episode, each run until its first episode ends. The eval
    envs are seeded once; later evaluations continue their RNG, so every
    evaluation sees fresh but reproducible start states.
    """

    def __init__(self, env_id: str, episodes: int, seed: int):
        self.envs = make_vector_env(env_id, episodes, seed, record_stats=False)
        self.seed: int | None = seed

    def __call__(self, algorithm, obs_normalizer: ObservationNormalizer) -> np.ndarray:
        raw_obs, _ = self.envs.reset(seed=self.seed)
        self.seed = None
        num = self.envs.num_envs
        returns = np.zeros(num)
        finished = np.zeros(num, dtype=bool)
        while not finished.all():
            obs = torch.as_tensor(obs_normalizer(raw_obs, update=False), dtype=torch.float32)
            with torch.inference_mode():
                action = algorithm.act_deterministic(obs).numpy()
            raw_obs, reward, terminated, truncated, _ = self.envs.step(action)
            returns += np.where(finished, 0.0, reward)
            finished |= terminated | truncated
        return returns

    def close(self) -> None:
        self.envs.close()


def train(cfg: DictConfig, run_dir: Path) -> dict:
    """Train one (algo, env, seed) for cfg.total_steps env steps; write logs to run_dir; return the summary."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    start_time = time.perf_counter()
    commit = git_commit()  # at start: the code this process actually loaded
    torch.set_num_threads(cfg.torch_threads)
    seed_everything(cfg.seed)
    env_cfg, algo_cfg = cfg.env, cfg.algo

    envs = make_vector_env(env_cfg.id, env_cfg.num_envs, cfg.seed)
    obs_dim, action_dim, discrete, action_shape = space_dims(envs)
    num_envs, num_steps = env_cfg.num_envs, env_cfg.num_steps
    steps_per_iteration = num_envs * num_steps
    num_iterations = cfg.total_steps // steps_per_iteration

    algorithm = build_algorithm(algo_cfg.algorithm, obs_dim, action_dim, discrete, algo_cfg, num_iterations)
    obs_normalizer = ObservationNormalizer((obs_dim,), env_cfg.normalize_obs, clip=env_cfg.obs_clip)
    reward_scaler = RewardScaler(num_envs, algo_cfg.gamma, env_cfg.scale_reward, clip=env_cfg.reward_clip)
    rollout = Rollout.allocate(num_steps, num_envs, obs_dim, action_shape)
    evaluator = Evaluator(env_cfg.id, cfg.eval.episodes, cfg.seed + 1_000_000)
    logger = RunLogger(run_dir, cfg.total_steps, cfg.logging.tensorboard, cfg.logging.progress_bar)
    episodes_log = CSVLog(run_dir / "episodes.csv")

    def run_evaluation(env_steps: int, iteration: int) -> dict:
        returns = evaluator(algorithm, obs_normalizer)
        row = {
            "env_steps": env_steps,
            "iteration": iteration,
            "wall_time": time.perf_counter() - start_time,
            "eval_return_mean": float(returns.mean()),
            "eval_return_std": float(returns.std()),
            "eval_episodes": len(returns),
        }
        logger.log_eval(row)
        return row

    raw_obs, _ = envs.reset(seed=cfg.seed)
    obs = torch.as_tensor(obs_normalizer(raw_obs, update=True), dtype=torch.float32)
    # True where the previous step ended an episode: the coming step is a reset step.
    episode_ended = np.zeros(num_envs, dtype=bool)
    env_steps = 0
    last_eval = run_evaluation(0, 0) if cfg.eval.at_start else None
    next_eval_at = cfg.eval.every_steps

    # numpy views of the rollout's env-side columns: writing a row through them
    # costs a fraction of a tensor __setitem__ and shares the same memory.
    rewards_np, raw_rewards_np = rollout.rewards.numpy(), rollout.raw_rewards.numpy()
    terminated_np, truncated_np, valid_np = rollout.terminated.numpy(), rollout.truncated.numpy(), rollout.valid.numpy()

    for iteration in range(1, num_iterations + 1):
        iteration_start = time.perf_counter()
        episode_returns, episode_lengths = [], []
        with torch.inference_mode():
            for t in range(num_steps):
                valid = ~episode_ended
                action, log_prob, value = algorithm.act(obs)
                rollout.obs[t] = obs
                rollout.actions[t] = action
                rollout.log_probs[t] = log_prob
                rollout.values[t] = value
                valid_np[t] = valid

                raw_obs, reward, terminated, truncated, info = envs.step(action.numpy())
                episode_ended = terminated | truncated
                raw_rewards_np[t] = reward
                rewards_np[t] = reward_scaler(reward, episode_ended, valid)
                terminated_np[t] = terminated
                truncated_np[t] = truncated
                obs = torch.as_tensor(obs_normalizer(raw_obs, update=True), dtype=torch.float32)

                if "_episode" in info:
                    done = info["_episode"]
                    episode_returns.extend(info["episode"]["r"][done].tolist())
                    episode_lengths.extend(info["episode"]["l"][done].tolist())
            rollout.next_value = algorithm.value(obs)
        env_steps += steps_per_iteration
        for ret, length in zip(episode_returns, episode_lengths):
            episodes_log.write({"env_steps": env_steps, "episode_return": ret, "episode_length": length})

        update_start = time.perf_counter()
        stats = algorithm.update(rollout, iteration)
        now = time.perf_counter()
        row = {
            "env_steps": env_steps,
            "iteration": iteration,
            "wall_time": now - start_time,
            "sps": steps_per_iteration / (now - iteration_start),
            "rollout_time": update_start - iteration_start,
            "update_time": now - update_start,
            "episodes": len(episode_returns),
            "episode_return_mean": float(np.mean(episode_returns)) if episode_returns else float("nan"),
            "episode_return_std": float(np.std(episode_returns)) if episode_returns else float("nan"),
            "episode_length_mean": float(np.mean(episode_lengths)) if episode_lengths else float("nan"),
            **stats,
        }
        logger.log_train(row)

        if env_steps >= next_eval_at or iteration == num_iterations:
            last_eval = run_evaluation(env_steps, iteration)
            while next_eval_at <= env_steps:
                next_eval_at += cfg.eval.every_steps

    wall_time = time.perf_counter() - start_time
    checkpoint = {
        "algorithm": algorithm.state_dict(),
        "obs_normalizer": obs_normalizer.state_dict(),
        "reward_scaler": reward_scaler.state_dict(),
        "env_steps": env_steps,
        "iteration": num_iterations,
        "config": OmegaConf.to_container(cfg, resolve=True),
    }
    if cfg.logging.checkpoint:
        save_atomic(checkpoint, run_dir / "checkpoint.pt")
    summary = {
        "status": "complete",
        "env": env_cfg.name,
        "algo": algo_cfg.name,
        "seed": cfg.seed,
        "env_steps": env_steps,
        "iterations": num_iterations,
        "final_eval_return_mean": last_eval["eval_return_mean"] if last_eval else None,
        "final_eval_return_std": last_eval["eval_return_std"] if last_eval else None,
        "wall_time_s": wall_time,
        "sps": env_steps / wall_time,
        "versions": versions(),
        "git_commit": commit,
        "config": OmegaConf.to_container(cfg, resolve=True),
    }
    write_json_atomic(run_dir / "summary.json", summary)
    logger.close()
    episodes_log.close()
    envs.close()
    evaluator.close()
    return summary


def save_atomic(obj, path: Path) -> None:
    tmp = Path(str(path) + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def versions() -> dict:
    import hydra
    import mujoco

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gymnasium": gym.__version__,
        "mujoco": mujoco.__version__,
        "numpy": np.__version__,
        "hydra": hydra.__version__,
    }


def git_commit() -> str | None:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=PROJECT_ROOT,
                               capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if commit.returncode != 0:
        return None
    return commit.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
