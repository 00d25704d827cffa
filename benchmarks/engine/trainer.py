"""train(), and the pieces of the training loop every algorithm shares (collect -> update -> log -> evaluate ->
checkpoint, written once in batch_trainer.py).

The trainer never knows which algorithm it drives; the algorithm never
touches envs, files or Hydra. Its pieces, each in its own module: the run's configuration (config.py),
checkpoints and random streams (checkpoint.py), the run directory's lock and provenance (run_dir.py),
the loop itself (batch_trainer.py: a population of seeds, a single run being a population of one); here
what the loop is built from: evaluation, preemption signals, the finiteness check, the phase timers and
the iteration's log row.
"""

from __future__ import annotations

import math
import random
import signal
import sys
import threading
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from omegaconf import DictConfig

from algorithms.core import ObservationNormalizer
from benchmarks.engine.envs import find_spec, make_vector_env
from benchmarks.engine.logger import EPISODE_COLUMNS, CSVLog, RunLogger, episode_statistics


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

    columns: dict = {}  # what an evaluation measures beside the returns, for eval.csv (a token task's SampledEvaluator)
    # An episode longer than this (or than the task's own time limit, where that is longer) is taken for a task
    # whose episodes never end: the evaluation stops with an error instead of running forever.
    MOST_STEPS = 100_000

    def __init__(self, env_id: str, episodes: int, seed: int, env_kwargs: dict | None = None):
        self.envs = make_vector_env(env_id, episodes, seed, record_stats=False, env_kwargs=env_kwargs)
        self.seed: int | None = seed
        self.env_id = env_id
        time_limit = (env_kwargs or {}).get("max_episode_steps") or find_spec(env_id).max_episode_steps
        self.most_steps = max(self.MOST_STEPS, time_limit or 0)

    def __call__(self, algorithm, obs_normalizer: ObservationNormalizer) -> np.ndarray:
        raw_obs, _ = self.envs.reset(seed=self.seed)
        self.seed = None
        num = self.envs.num_envs
        returns = np.zeros(num)
        finished = np.zeros(num, dtype=bool)
        for _ in range(self.most_steps):
            obs = torch.as_tensor(obs_normalizer(raw_obs, update=False), dtype=torch.float32)
            with torch.inference_mode():
                action = algorithm.act_deterministic(obs).numpy()
            raw_obs, reward, terminated, truncated, _ = self.envs.step(action)
            returns += np.where(finished, 0.0, reward)
            finished |= terminated | truncated
            if finished.all():
                return returns
        raise EpisodeNeverEnds(f"evaluation: an episode of env.id={self.env_id} has not ended after {self.most_steps:,} "
                               f"steps: its episodes do not end on their own; register the task with a time limit "
                               f"(gymnasium.register(..., max_episode_steps=N))")

    def close(self) -> None:
        self.envs.close()


class EpisodeNeverEnds(gym.error.Error):
    """An evaluation episode that ran past any time limit: the task's episodes do not end on their own."""


def make_evaluator(cfg: DictConfig, env_kwargs: dict | None):
    """The run's evaluator: K episodes of the deterministic policy, or a token task's own (sampled responses
    to held-out prompts, benchmarks/rlhf/evaluation.py)."""
    if cfg.env.get("evaluation", {}).get("kind") == "sampled":
        from benchmarks.rlhf.evaluation import SampledEvaluator

        return SampledEvaluator(cfg.env.id, cfg.eval.episodes, cfg.env.evaluation.seed, env_kwargs)
    return Evaluator(cfg.env.id, cfg.eval.episodes, cfg.seed + 1_000_000, env_kwargs)


class NonFiniteError(RuntimeError):
    """A loss, gradient or parameter became NaN/inf; the message names the iteration and the quantity."""


class TrainingInterrupted(Exception):
    """A stop signal arrived (PreemptionSignals); the state is checkpointed and the run can resume, unless
    checkpoints are off (logging.checkpoint=false). ended: how the run ended in the iteration the signal arrived
    in (it completed, or it stopped on non-finite numbers); the signal still stops the process (a sweep's next
    job does not start)."""

    def __init__(self, signum: int, env_steps: int, checkpointed: bool = True, ended: str | None = None):
        self.signum, self.env_steps = signum, env_steps
        if ended is not None:
            super().__init__(f"{signal.Signals(signum).name} in the iteration {ended}")
            return
        resume = ("checkpoint written; rerun the same command to resume" if checkpointed else
                  "no checkpoint (logging.checkpoint=false): rerunning the command trains the run again from the start")
        super().__init__(f"{signal.Signals(signum).name} at {env_steps} env steps: {resume}")


class PreemptionSignals:
    """Turns SIGTERM, SIGUSR1 (Slurm --signal), SIGUSR2 (submitit) and SIGINT (Ctrl-C) into a flag read between
    iterations.

    A signal never interrupts an update half-way: the loop finishes its
    iteration, checkpoints, and then `hand_over` passes the signal to the
    handler that was installed before (submitit's requeues the job) or stops
    the run with TrainingInterrupted.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT)

    def __init__(self, checkpointed: bool = True):
        self.arrived: dict = {}  # signal number -> the frame it interrupted, in order of arrival
        self.previous: dict = {}
        self.checkpointed = checkpointed  # False: logging.checkpoint=false, a stop keeps nothing to resume from
        self.said_ctrl_c = False

    def __enter__(self) -> "PreemptionSignals":
        if threading.current_thread() is threading.main_thread():  # Python allows handlers only there
            for signum in self.SIGNALS:
                if signum == signal.SIGINT and signal.getsignal(signum) is signal.SIG_IGN:
                    continue  # a job a script started in the background: the terminal's Ctrl-C is not for it
                # The handler is C code (a dict's __setitem__), not a Python function: Python runs a handler as a
                # new frame wherever the signal lands, and a new frame inside a compiled population program that
                # skips its guards (algorithms.population.UncheckedCalls) makes torch raise a RuntimeError
                # instead of recording the signal, failing the run it should have checkpointed.
                self.previous[signum] = signal.signal(signum, self.arrived.__setitem__)
        return self

    @property
    def received(self) -> int | None:
        """The first signal that arrived, or None."""
        return next(iter(self.arrived), None)

    def say_ctrl_c(self) -> None:
        """Called by the loop between env steps and after the update: a Ctrl-C that arrived is answered there, and a
        second one stops the run where it is (Python's own KeyboardInterrupt; the run resumes from its last
        checkpoint)."""
        if signal.SIGINT in self.arrived and not self.said_ctrl_c:
            self.said_ctrl_c = True
            print(f"Ctrl-C: stopping after this iteration{', with a checkpoint' if self.checkpointed else ''}; "
                  f"Ctrl-C again stops at once", file=sys.stderr, flush=True)
            signal.signal(signal.SIGINT, signal.default_int_handler)

    def __exit__(self, *exc) -> None:
        # (self.previous stays: a signal of the run's last iteration is handed over after the run's end, below)
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.arrived = dict.fromkeys(self.arrived)  # the signals stay known; the frames they hold go

    def hand_over(self, env_steps: int, ended: str | None = None) -> None:
        """Gives the handlers back and passes the signal on: to the handler installed before (submitit's requeues
        the job), then TrainingInterrupted. ended: how the run ended in the iteration the signal arrived in."""
        signum, previous = self.received, self.previous.get(self.received)
        self.__exit__()
        if callable(previous) and previous is not signal.default_int_handler:
            previous(signum, None)  # submitit: checkpoint() -> requeue -> exit
        raise TrainingInterrupted(signum, env_steps, self.checkpointed, ended)


def check_finite(algorithm, stats: dict, iteration: int, env_steps: int, rollout=None, next_obs=None) -> None:
    """A NonFiniteError naming the first non-finite number: the task's own (the rollout's rewards and observations,
    and the observation after its last step: the cause when there is one), then the update's statistics and
    parameters."""
    where = f"at iteration {iteration} ({env_steps} env steps)"
    if rollout is not None:
        for name, values in (("reward", rollout.raw_rewards), ("observation", rollout.obs),
                             ("observation", torch.as_tensor(next_obs))):
            if not torch.isfinite(values).all():
                raise NonFiniteError(f"the task's env returned a non-finite {name} {where}; the last good "
                                     f"checkpoint is kept")
    for key in algorithm.guarded_stats:
        if key in stats and not math.isfinite(stats[key]):
            raise NonFiniteError(f"non-finite {key} ({stats[key]}) {where}; the last good checkpoint is kept")
    for name, parameter in algorithm.named_parameters():
        if not torch.isfinite(parameter).all():
            raise NonFiniteError(f"non-finite parameter {name} {where}; the last good checkpoint is kept")


# The phases of the loop, timed as it runs (summary.json "phase_seconds"; benchmarks.speed.profile reads them).
LOOP_PHASES = ("act", "env step", "reward scaling", "observation normalisation", "update", "evaluation",
               "logging and checkpoints")


class PhaseTimes:
    """Seconds spent in each phase of the training loop, over every segment of a resumed run."""

    def __init__(self, seconds: dict | None = None):
        self.seconds = {phase: 0.0 for phase in LOOP_PHASES}
        self.seconds.update(seconds or {})

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] += seconds


def train(cfg: DictConfig, run_dir: Path, announce=None) -> dict:
    """Train one (algo, env, seed) for cfg.total_steps env steps; write logs to run_dir; return the summary.

    A single run is a population of one, trained by the one training loop (benchmarks/engine/batch_trainer.py).
    If run_dir holds a checkpoint of the same config, training resumes from it and logs exactly what an
    uninterrupted run would have logged. One process at a time per run directory (run_lock). announce: called
    once the directory is this process's (train_batch).
    """
    from benchmarks.engine.batch_trainer import train_batch  # it builds on this module's pieces

    return train_batch(cfg, [Path(run_dir)], [cfg.seed], one_run=True, announce=announce)[0]


def pause_requested(cfg: DictConfig, env_steps: int, iteration: int, num_iterations: int) -> bool:
    """pause_at_steps reached before the last iteration: checkpoint and stop with status "paused"."""
    pause_at = cfg.get("pause_at_steps")
    return pause_at is not None and env_steps >= pause_at and iteration < num_iterations


def log_iteration(logger: RunLogger, episodes_log: CSVLog, stats: dict, env_steps: int, iteration: int,
                  episode_returns: list, episode_lengths: list, times: tuple, steps_per_iteration: int) -> None:
    """The iteration's finished episodes into episodes.csv and its row into train.csv (and TensorBoard).

    times: (run start, iteration start, update start, now) from time.perf_counter.
    """
    start_time, iteration_start, update_start, now = times
    for ret, length in zip(episode_returns, episode_lengths):
        episodes_log.write(dict(zip(EPISODE_COLUMNS, (env_steps, ret, length))))
    logger.log_train({
        "env_steps": env_steps,
        "iteration": iteration,
        "wall_time": now - start_time,
        "sps": steps_per_iteration / (now - iteration_start),
        "rollout_time": update_start - iteration_start,
        "update_time": now - update_start,
        **episode_statistics(episode_returns, episode_lengths),
        **stats,
    })


def final_metrics(last_eval: dict | None) -> dict:
    """What the HParams view compares runs by: the final evaluation's mean and std."""
    if last_eval is None:
        return {}
    return {"final_eval_return_mean": last_eval["eval_return_mean"], "final_eval_return_std": last_eval["eval_return_std"]}


