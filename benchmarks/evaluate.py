"""Evaluate a saved agent: rebuild it from checkpoint.pt alone and run deterministic episodes.

    python -m benchmarks.evaluate runs/HalfCheetah/ppo/seed0/checkpoint.pt --episodes 10 --seed 123
    python -m benchmarks.evaluate runs/HalfCheetah/ppo/seed0        # the run directory: its checkpoint.pt

A token task's run evaluated by sampling (env.evaluation.kind=sampled, docs/rlhf.md) is evaluated as its
training evaluated it: responses sampled at its temperature to --episodes prompts drawn from --seed (by default
the run's own evaluation prompts, eval.episodes of them from env.evaluation.seed, so a final checkpoint scores
its run's last evaluation row), with the reward model's and the judge's score and the KL to the reference
beside the return.

The checkpoint holds the resolved config, the networks, the optimizer(s) and
the normalisation statistics; it is loaded with torch.load(weights_only=True),
which executes no pickled code.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from omegaconf import OmegaConf

from algorithms import build_algorithm
from algorithms.core import ObservationNormalizer
from benchmarks.engine.checkpoint import CheckpointDamaged, CheckpointError, read_checkpoint
from benchmarks.engine.config import task_kwargs, task_network, with_later_keys
from benchmarks.engine.envs import make_vector_env, space_dims
from benchmarks.engine.trainer import Evaluator
from benchmarks.arguments import existing_file, number_in, seed_number


def load_agent(checkpoint_path: Path):
    """(algorithm, obs_normalizer, config) restored from a checkpoint; CheckpointError, in one line, for a file
    that is not one."""
    try:
        checkpoint = read_checkpoint(checkpoint_path)
    except (OSError, CheckpointDamaged) as error:  # unreadable, or a checkpoint whose bytes fail their digest
        raise CheckpointError(f"{checkpoint_path}: {error}") from None
    except Exception as error:  # torch raises several types for a file that is not a checkpoint
        raise CheckpointError(f"{checkpoint_path} is not a checkpoint this suite wrote (torch.load: "
                              f"{type(error).__name__})") from None
    if not isinstance(checkpoint, dict) or "config" not in checkpoint:
        raise CheckpointError(f"{checkpoint_path} is not a checkpoint this suite wrote (no config in it)")
    cfg = OmegaConf.create(with_later_keys(checkpoint["config"]))  # a run stored before a key existed, as it ran
    probe = make_vector_env(cfg.env.id, 1, 0, record_stats=False, env_kwargs=task_kwargs(cfg.env))
    obs_dim, action_dim, discrete, _ = space_dims(probe, cfg.env.id)
    probe.close()
    num_iterations = cfg.total_steps // (cfg.env.num_envs * cfg.env.num_steps)
    try:
        algorithm = build_algorithm(cfg.algo.algorithm, obs_dim, action_dim, discrete, cfg.algo, num_iterations,
                                    network=task_network(cfg.env))
    except ValueError as error:  # an algorithm this checkout cannot build (a module:Class not importable here)
        raise CheckpointError(f"{checkpoint_path}: {error}") from None
    # the policy is all an evaluation needs (an optimizer's state may be of a retired backend's layout)
    algorithm.policy.load_state_dict(checkpoint["algorithm"]["policy"])
    obs_normalizer = ObservationNormalizer((obs_dim,), cfg.env.normalize_obs, clip=cfg.env.obs_clip)
    obs_normalizer.load_state_dict(checkpoint["obs_normalizer"])
    return algorithm, obs_normalizer, cfg


def checkpoint_file(text: str) -> Path:
    """argparse type: a checkpoint file, or a run directory (its newest checkpoint, checkpoint.pt)."""
    path = Path(text)
    if path.is_dir():
        if not (path / "checkpoint.pt").is_file():
            runs = [str(run) for run in batch_runs(path) if (run / "checkpoint.pt").is_file()]
            inside = f"; its runs: {', '.join(runs)} (give one)" if runs else ""
            raise argparse.ArgumentTypeError(f"{text} is a directory without a checkpoint.pt (a run directory holds "
                                             f"one once its first checkpoint is written){inside}")
        return path / "checkpoint.pt"
    return existing_file(text)


def batch_runs(path: Path) -> list[Path]:
    """The runs a directory holds that is not one: a batch job's seeds (beside it, by its job mark) or the
    directories inside it (an algorithm's seeds, a batch given its own run directory)."""
    from benchmarks.engine.hydra_callbacks import JOB_MARK, job_run_dirs

    if (path / JOB_MARK).is_file():
        return job_run_dirs(path)
    return sorted(child for child in path.iterdir() if child.is_dir())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=checkpoint_file, help="a checkpoint.pt, or the run directory holding it")
    parser.add_argument("--episodes", type=number_in(1, integer=True), default=None,
                        help="episodes (default 10; a sampled token-task run: its eval.episodes)")
    parser.add_argument("--seed", type=seed_number, default=None,
                        help="seed of the evaluation envs (default 12345; a sampled token-task run: its "
                             "env.evaluation.seed, the prompts its training evaluated on)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    try:
        algorithm, obs_normalizer, cfg = load_agent(args.checkpoint)
    except CheckpointError as error:
        parser.error(f"argument checkpoint: {error}")
    sampled = cfg.env.get("evaluation", {}).get("kind") == "sampled"
    if args.episodes is None:
        args.episodes = cfg.eval.episodes if sampled else 10
    if args.seed is None:
        args.seed = cfg.env.evaluation.seed if sampled else 12345
    try:
        if sampled:
            from benchmarks.rlhf.evaluation import SampledEvaluator

            evaluator = SampledEvaluator(cfg.env.id, args.episodes, args.seed, task_kwargs(cfg.env))
        else:
            evaluator = Evaluator(cfg.env.id, args.episodes, args.seed, task_kwargs(cfg.env))
        returns = evaluator(algorithm, obs_normalizer)
    except gym.error.Error as error:  # the task's own error, one no longer registered, an endless episode: one line
        sys.exit(f"error: {error}")
    evaluator.close()
    kind, unit = ("sampled", "prompts") if sampled else ("deterministic", "episodes")
    others = "".join(f", {column.removeprefix('eval_').removesuffix('_mean')} {value:.2f}"
                     for column, value in evaluator.columns.items())
    print(f"{cfg.algo.name} on {cfg.env.id}: {kind} return {np.mean(returns):.2f} +- {np.std(returns):.2f} "
          f"over {args.episodes} {unit}{others}")


if __name__ == "__main__":
    main()
