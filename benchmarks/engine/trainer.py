"""The training loop every algorithm shares: collect -> algorithm.update -> log -> evaluate -> checkpoint.

The trainer never knows which algorithm it drives; the algorithm never
touches envs, files or Hydra. Its pieces, each in its own module: the run's configuration (config.py),
checkpoints and random streams (checkpoint.py), the run directory's lock and provenance (run_dir.py);
a population of seeds trains in batch_trainer.py.
"""

from __future__ import annotations

import math
import random
import signal
import sys
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from algorithms import build_algorithm
from algorithms.core import ObservationNormalizer, RewardScaler, Rollout
from benchmarks import numerics
from benchmarks.engine.checkpoint import CHECKPOINT_FORMAT, load_checkpoint, load_rng_states, rng_states, save_checkpoint
from benchmarks.engine.config import task_kwargs, task_network
from benchmarks.engine.env_state import load_vector_env_state, vector_env_state
from benchmarks.engine.envs import make_vector_env, space_dims
from benchmarks.engine.logger import CSVLog, RunLogger, write_json_atomic
from benchmarks.engine.reference_kl import EpisodeInfoMeans, ReferenceKLPenalty, whiten_rewards
from benchmarks.engine.run_dir import git_commit, machine, run_label, run_lock, versions


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

    def __init__(self, env_id: str, episodes: int, seed: int, env_kwargs: dict | None = None):
        self.envs = make_vector_env(env_id, episodes, seed, record_stats=False, env_kwargs=env_kwargs)
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


class NonFiniteError(RuntimeError):
    """A loss, gradient or parameter became NaN/inf; the message names the iteration and the quantity."""


class TrainingInterrupted(Exception):
    """SIGTERM/SIGUSR1/SIGUSR2 arrived; the state is checkpointed and the run can resume."""

    def __init__(self, signum: int, env_steps: int):
        self.signum, self.env_steps = signum, env_steps
        super().__init__(f"{signal.Signals(signum).name} at {env_steps} env steps: checkpoint written; "
                         f"rerun the same command to resume")


class PreemptionSignals:
    """Turns SIGTERM, SIGUSR1 (Slurm --signal) and SIGUSR2 (submitit) into a flag read between iterations.

    A signal never interrupts an update half-way: the loop finishes its
    iteration, checkpoints, and then `hand_over` passes the signal to the
    handler that was installed before (submitit's requeues the job) or stops
    the run with TrainingInterrupted.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)

    def __init__(self):
        self.received: int | None = None
        self.previous: dict = {}

    def __enter__(self) -> "PreemptionSignals":
        if threading.current_thread() is threading.main_thread():  # Python allows handlers only there
            for signum in self.SIGNALS:
                self.previous[signum] = signal.signal(signum, self._record)
        return self

    def _record(self, signum, frame) -> None:
        self.received = signum

    def __exit__(self, *exc) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous = {}

    def hand_over(self, env_steps: int) -> None:
        signum, previous = self.received, self.previous.get(self.received)
        self.__exit__()
        if callable(previous) and previous is not signal.default_int_handler:
            previous(signum, None)  # submitit: checkpoint() -> requeue -> exit
        raise TrainingInterrupted(signum, env_steps)


def check_finite(algorithm, stats: dict, iteration: int, env_steps: int) -> None:
    where = f"at iteration {iteration} ({env_steps} env steps)"
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


def train(cfg: DictConfig, run_dir: Path) -> dict:
    """Train one (algo, env, seed) for cfg.total_steps env steps; write logs to run_dir; return the summary.

    If run_dir holds a checkpoint of the same config, training resumes from
    it and logs exactly what an uninterrupted run would have logged. One process
    at a time per run directory (run_lock).
    """
    run_dir = Path(run_dir)
    if cfg.algo.backend == "compiled":  # a population of one: the one loop populations train in
        from benchmarks.engine.batch_trainer import train_batch

        return train_batch(cfg, [run_dir], [cfg.seed], one_run=True)[0]
    if cfg.algo.backend != "torch":
        raise ValueError(f"algo.backend must be compiled or torch, got {cfg.algo.backend!r}")
    run_dir.mkdir(parents=True, exist_ok=True)
    with run_lock(run_dir):
        return train_locked(cfg, run_dir)


class TrainingState:
    """What a checkpoint holds and a resume restores, written once (state_dict / load_state_dict).

    The agent (the algorithm with its networks, optimizers and buffers; the observation and
    reward statistics), the environments mid-episode (training and evaluation), the random
    streams, and the loop's position: the last completed iteration, env steps, the next
    evaluation, the last evaluation's row, training seconds so far, the phase timers, and the
    observation and episode-end flags the next step starts from.
    """

    def __init__(self, cfg: DictConfig, algorithm, obs_normalizer: ObservationNormalizer,
                 reward_scaler: RewardScaler, envs, evaluator: "Evaluator", kl_penalty: ReferenceKLPenalty | None = None):
        self.config = OmegaConf.to_container(cfg, resolve=True)
        self.algorithm, self.obs_normalizer, self.reward_scaler = algorithm, obs_normalizer, reward_scaler
        self.kl_penalty = kl_penalty
        self.envs, self.evaluator = envs, evaluator
        self.iteration = 0          # the last completed iteration
        self.env_steps = 0
        self.next_eval_at = cfg.eval.every_steps
        self.last_eval: dict | None = None
        self.resumed_at: list[int] = []  # env steps at which each resume started
        self.elapsed = 0.0          # training seconds before this process started
        self.phases = PhaseTimes()
        self.obs: torch.Tensor | None = None
        # True where the previous step ended an episode: the coming step is a reset step.
        self.episode_ended = np.zeros(cfg.env.num_envs, dtype=bool)

    def start(self, seed: int) -> None:
        """A fresh run's first observation."""
        raw_obs, _ = self.envs.reset(seed=seed)
        self.obs = torch.as_tensor(self.obs_normalizer(raw_obs, update=True), dtype=torch.float32)

    def state_dict(self, wall_time: float, log_sizes: dict[str, int]) -> dict:
        return {
            "format": CHECKPOINT_FORMAT,
            "config": self.config,
            "numerics": numerics.MODE,
            "algorithm": self.algorithm.state_dict(),
            "obs_normalizer": self.obs_normalizer.state_dict(),
            "reward_scaler": self.reward_scaler.state_dict(),
            **({"kl_penalty": self.kl_penalty.state_dict()} if self.kl_penalty is not None else {}),
            "env_steps": self.env_steps,
            "iteration": self.iteration,
            "rng": self.rng_state(),
            "envs": vector_env_state(self.envs),
            "eval_envs": vector_env_state(self.evaluator.envs),
            "eval_seed": self.evaluator.seed,
            "loop": {"obs": self.obs_tensor(), "episode_ended": torch.from_numpy(self.episode_ended.copy()),
                     "next_eval_at": self.next_eval_at, "last_eval": self.last_eval, "resumed_at": self.resumed_at,
                     "wall_time": wall_time, "phase_seconds": dict(self.phases.seconds)},
            "logs": log_sizes,  # bytes of each CSV log at this point: a resume cuts them back to it
        }

    # Where the random streams and the current observation live: here the process's global streams and a
    # tensor; a seed of a batch (benchmarks/engine/batch_trainer.py) keeps its own streams and a numpy array.
    def rng_state(self) -> dict:
        return rng_states()

    def load_rng_state(self, state: dict) -> None:
        load_rng_states(state)

    def obs_tensor(self) -> torch.Tensor:
        return self.obs.clone()

    def load_obs(self, obs: torch.Tensor) -> None:
        self.obs = obs.clone()

    def load_state_dict(self, checkpoint: dict) -> None:
        self.algorithm.load_state_dict(checkpoint["algorithm"])
        self.obs_normalizer.load_state_dict(checkpoint["obs_normalizer"])
        self.reward_scaler.load_state_dict(checkpoint["reward_scaler"])
        if self.kl_penalty is not None:
            self.kl_penalty.load_state_dict(checkpoint["kl_penalty"])
        load_vector_env_state(self.envs, checkpoint["envs"])
        load_vector_env_state(self.evaluator.envs, checkpoint["eval_envs"])
        self.evaluator.seed = checkpoint["eval_seed"]
        self.load_rng_state(checkpoint["rng"])
        loop = checkpoint["loop"]
        self.load_obs(loop["obs"])
        self.episode_ended = loop["episode_ended"].numpy().copy()
        self.iteration, self.env_steps = checkpoint["iteration"], checkpoint["env_steps"]
        self.elapsed, self.last_eval, self.next_eval_at = loop["wall_time"], loop["last_eval"], loop["next_eval_at"]
        self.resumed_at = loop["resumed_at"] + [self.env_steps]
        self.phases.seconds.update(loop.get("phase_seconds") or {})  # absent from checkpoints made before the timers


def train_locked(cfg: DictConfig, run_dir: Path) -> dict:
    commit = git_commit()  # at start: the code this process actually loaded
    torch.set_num_threads(cfg.torch_threads)
    seed_everything(cfg.seed)
    env_cfg, algo_cfg = cfg.env, cfg.algo

    env_kwargs = task_kwargs(env_cfg)
    envs = make_vector_env(env_cfg.id, env_cfg.num_envs, cfg.seed, env_kwargs=env_kwargs)
    obs_dim, action_dim, discrete, action_shape = space_dims(envs)
    num_envs, num_steps = env_cfg.num_envs, env_cfg.num_steps
    steps_per_iteration = num_envs * num_steps
    num_iterations = cfg.total_steps // steps_per_iteration

    algorithm = build_algorithm(algo_cfg.algorithm, obs_dim, action_dim, discrete, algo_cfg, num_iterations,
                                network=task_network(env_cfg))
    obs_normalizer = ObservationNormalizer((obs_dim,), env_cfg.normalize_obs, clip=env_cfg.obs_clip)
    reward_scaler = RewardScaler(num_envs, algo_cfg.gamma, env_cfg.scale_reward, clip=env_cfg.reward_clip)
    # Token tasks (RLHF): the per-token KL penalty to the reference model, and the task's per-episode numbers.
    kl_penalty = ReferenceKLPenalty(env_cfg.kl_penalty, num_envs) if "kl_penalty" in env_cfg else None
    episode_infos = EpisodeInfoMeans()
    rollout = Rollout.allocate(num_steps, num_envs, obs_dim, action_shape)
    if env_cfg.get("evaluation", {}).get("kind") == "sampled":  # token tasks: benchmarks/rlhf/evaluation.py
        from benchmarks.rlhf.evaluation import SampledEvaluator

        evaluator = SampledEvaluator(env_cfg.id, cfg.eval.episodes, env_cfg.evaluation.seed, env_kwargs)
    else:
        evaluator = Evaluator(env_cfg.id, cfg.eval.episodes, cfg.seed + 1_000_000, env_kwargs)
    # NEXT_STEP autoreset: the step after an episode ends is a reset that ignores its action (valid False); a
    # SAME_STEP env (the token tasks) resets within the step that ends an episode, and every step is valid.
    same_step_reset = envs.metadata.get("autoreset_mode") == gym.vector.AutoresetMode.SAME_STEP
    state = TrainingState(cfg, algorithm, obs_normalizer, reward_scaler, envs, evaluator, kl_penalty)
    phases = state.phases

    checkpoint = load_checkpoint(run_dir, cfg) if cfg.logging.checkpoint else None
    if checkpoint is None:
        state.start(cfg.seed)
        logger = RunLogger(run_dir, cfg.total_steps, cfg.logging.tensorboard, cfg.logging.progress_bar,
                           label=run_label(cfg))
        episodes_log = CSVLog(run_dir / "episodes.csv")
    else:
        state.load_state_dict(checkpoint)
        logs = checkpoint["logs"]
        logger = RunLogger(run_dir, cfg.total_steps, cfg.logging.tensorboard, cfg.logging.progress_bar,
                           resume={"sizes": logs, "env_steps": state.env_steps}, label=run_label(cfg))
        episodes_log = CSVLog(run_dir / "episodes.csv", logs["episodes.csv"])
        print(f"resuming {run_dir} from its checkpoint at {state.env_steps} env steps", file=sys.stderr)
    # wall_time counts the time of every segment of an interrupted run up to its checkpoint.
    start_time = time.perf_counter() - state.elapsed
    checkpoint_every = cfg.logging.checkpoint_every_steps
    next_checkpoint_at = (state.env_steps // checkpoint_every + 1) * checkpoint_every

    def run_evaluation(env_steps: int, iteration: int) -> dict:
        started = time.perf_counter()
        returns = evaluator(algorithm, obs_normalizer)
        phases.add("evaluation", time.perf_counter() - started)
        row = {
            "env_steps": env_steps,
            "iteration": iteration,
            "wall_time": time.perf_counter() - start_time,
            "eval_return_mean": float(returns.mean()),
            "eval_return_std": float(returns.std()),
            "eval_episodes": len(returns),
            **evaluator.columns,
        }
        logger.log_eval(row)
        return row

    def write_checkpoint() -> None:
        save_checkpoint(state.state_dict(time.perf_counter() - start_time,
                                         {**logger.sizes(), "episodes.csv": episodes_log.size()}), run_dir)

    def summary_base(status: str) -> dict:
        return {"status": status, "env": env_cfg.name, "algo": algo_cfg.name, "seed": cfg.seed,
                "env_steps": state.env_steps, "resumed_at_env_steps": state.resumed_at}

    # numpy views of the rollout's columns: writing a row through them
    # costs a fraction of a tensor __setitem__ and shares the same memory.
    obs_np, actions_np = rollout.obs.numpy(), rollout.actions.numpy()
    log_probs_np, values_np = rollout.log_probs.numpy(), rollout.values.numpy()
    rewards_np, raw_rewards_np = rollout.rewards.numpy(), rollout.raw_rewards.numpy()
    terminated_np, truncated_np, valid_np = rollout.terminated.numpy(), rollout.truncated.numpy(), rollout.valid.numpy()

    try:
        with PreemptionSignals() as signals:
            # inside the signal guard: a SIGTERM during this first evaluation is honoured after the
            # first iteration (checkpoint, "interrupted" summary), never a silent kill
            if checkpoint is None and cfg.eval.at_start:
                state.last_eval = run_evaluation(0, 0)
            obs, episode_ended = state.obs, state.episode_ended
            for iteration in range(state.iteration + 1, num_iterations + 1):
                if pause_requested(cfg, state.env_steps, state.iteration, num_iterations):
                    # checkpointed where it paused (below), or resumed from a checkpoint already past the pause
                    paused = {**summary_base("paused"), "total_steps": cfg.total_steps, "config": state.config}
                    write_json_atomic(run_dir / "summary.json", paused)
                    return paused
                iteration_start = time.perf_counter()
                episode_returns, episode_lengths = [], []
                with torch.inference_mode():
                    for t in range(num_steps):
                        valid = ~episode_ended if not same_step_reset else np.ones_like(episode_ended)
                        before_act = time.perf_counter()
                        action, log_prob, value = algorithm.act(obs)
                        after_act = time.perf_counter()
                        obs_np[t] = obs.numpy()
                        actions_np[t] = action.numpy()
                        log_probs_np[t] = log_prob.numpy()
                        values_np[t] = value.numpy()
                        valid_np[t] = valid

                        before_step = time.perf_counter()
                        raw_obs, reward, terminated, truncated, info = envs.step(action.numpy())
                        after_step = time.perf_counter()
                        episode_ended = terminated | truncated
                        raw_rewards_np[t] = reward
                        if kl_penalty is not None:  # the reward learnt from: score - beta * log(pi / pi_ref)
                            reward = kl_penalty(reward, log_probs_np[t], info["ref_log_prob"], valid, episode_ended)
                        rewards_np[t] = reward_scaler(reward, episode_ended, valid)
                        after_scaling = time.perf_counter()
                        terminated_np[t] = terminated
                        truncated_np[t] = truncated
                        obs = torch.as_tensor(obs_normalizer(raw_obs, update=True), dtype=torch.float32)
                        phases.add("act", after_act - before_act)
                        phases.add("env step", after_step - before_step)
                        phases.add("reward scaling", after_scaling - after_step)
                        phases.add("observation normalisation", time.perf_counter() - after_scaling)

                        episode_infos.add(info)
                        if "_episode" in info:
                            done = info["_episode"]
                            episode_returns.extend(info["episode"]["r"][done].tolist())
                            episode_lengths.extend(info["episode"]["l"][done].tolist())
                    rollout.next_value = algorithm.value(obs)
                state.obs, state.episode_ended = obs, episode_ended  # where the next rollout starts
                state.env_steps += steps_per_iteration
                env_steps = state.env_steps

                if env_cfg.get("whiten_rewards", False):
                    whiten_rewards(rollout.rewards, rollout.valid)
                update_start = time.perf_counter()
                stats = algorithm.update(rollout, iteration)
                check_finite(algorithm, stats, iteration, env_steps)
                stats.update(kl_penalty.end_rollout() if kl_penalty is not None else {})
                stats.update(episode_infos.end_rollout())
                state.iteration = iteration
                now = time.perf_counter()
                phases.add("update", now - update_start)
                log_iteration(logger, episodes_log, stats, env_steps, iteration, episode_returns, episode_lengths,
                              times=(start_time, iteration_start, update_start, now),
                              steps_per_iteration=steps_per_iteration)
                phases.add("logging and checkpoints", time.perf_counter() - now)

                if env_steps >= state.next_eval_at or iteration == num_iterations:
                    state.last_eval = run_evaluation(env_steps, iteration)
                    while state.next_eval_at <= env_steps:
                        state.next_eval_at += cfg.eval.every_steps

                interrupted = signals.received is not None
                pausing = pause_requested(cfg, env_steps, iteration, num_iterations)
                if cfg.logging.checkpoint and (env_steps >= next_checkpoint_at or interrupted or pausing
                                               or iteration == num_iterations):
                    checkpoint_start = time.perf_counter()
                    write_checkpoint()
                    phases.add("logging and checkpoints", time.perf_counter() - checkpoint_start)
                    while next_checkpoint_at <= env_steps:
                        next_checkpoint_at += checkpoint_every
                if interrupted and iteration < num_iterations:
                    write_json_atomic(run_dir / "summary.json", {
                        **summary_base("interrupted"), "signal": signal.Signals(signals.received).name,
                        "checkpointed": bool(cfg.logging.checkpoint)})
                    signals.hand_over(env_steps)
        logger.log_hparams(state.config, final_metrics(state.last_eval))
    except Exception as error:
        if not isinstance(error, TrainingInterrupted):
            # The failure is recorded in the run's own directory, which the report then lists as failed.
            write_json_atomic(run_dir / "summary.json", {
                **summary_base("failed"), "error": f"{type(error).__name__}: {error}"})
        raise
    finally:
        logger.close()
        episodes_log.close()
        envs.close()
        evaluator.close()

    wall_time = time.perf_counter() - start_time
    summary = {
        **summary_base("complete"),
        "iterations": num_iterations,
        "final_eval_return_mean": state.last_eval["eval_return_mean"] if state.last_eval else None,
        "final_eval_return_std": state.last_eval["eval_return_std"] if state.last_eval else None,
        "wall_time_s": wall_time,
        "sps": state.env_steps / wall_time,
        "phase_seconds": phases.seconds,
        "versions": versions(),
        "machine": machine(),
        "git_commit": commit,
        "config": state.config,
    }
    write_json_atomic(run_dir / "summary.json", summary)
    return summary


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
        episodes_log.write({"env_steps": env_steps, "episode_return": ret, "episode_length": length})
    logger.log_train({
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
    })


def final_metrics(last_eval: dict | None) -> dict:
    """What the HParams view compares runs by: the final evaluation's mean and std."""
    if last_eval is None:
        return {}
    return {"final_eval_return_mean": last_eval["eval_return_mean"], "final_eval_return_std": last_eval["eval_return_std"]}


