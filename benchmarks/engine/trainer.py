"""The training loop every algorithm shares: collect -> algorithm.update -> log -> evaluate -> checkpoint.

The trainer never knows which algorithm it drives; the algorithm never
touches envs, files or Hydra.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import math
import os
import platform
import random
import signal
import subprocess
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
from benchmarks.engine.env_state import load_vector_env_state, vector_env_state
from benchmarks.engine.envs import make_vector_env, space_dims
from benchmarks.engine.reference_kl import EpisodeInfoMeans, ReferenceKLPenalty, whiten_rewards
from benchmarks.engine.logger import CSVLog, RunLogger, write_bytes_atomic, write_json_atomic

PROJECT_ROOT = Path(__file__).resolve().parents[2]


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


CHECKPOINT_FORMAT = 3  # 3: sub-envs gained the DropStepInfo wrapper layer
CHECKPOINT_FILES = ("checkpoint.pt", "checkpoint.prev.pt")  # newest first; the previous one is the fallback


class NonFiniteError(RuntimeError):
    """A loss, gradient or parameter became NaN/inf; the message names the iteration and the quantity."""


class CheckpointError(RuntimeError):
    """No usable checkpoint although the run directory says there should be one."""


class TrainingInterrupted(Exception):
    """SIGTERM/SIGUSR1/SIGUSR2 arrived; the state is checkpointed and the run can resume."""

    def __init__(self, signum: int, env_steps: int):
        self.signum, self.env_steps = signum, env_steps
        super().__init__(f"{signal.Signals(signum).name} at {env_steps} env steps: checkpoint written; "
                         f"rerun the same command to resume")


def compose_config(overrides: list[str]) -> DictConfig:
    """conf/config.yaml with these overrides, composed as `python run.py` composes it (for tools and tests)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def with_later_keys(config: dict) -> dict:
    """A stored run's config (summary.json, checkpoint) with every key it predates set to the value it ran
    with, as the schema declares it (`Before(...)` in a key's annotation in the Config dataclasses), so that a stored
    run compares key by key with a config composed today (skip and resume) and retrains as it ran (reproduce).
    The algo keys any algorithm's schema declares are filled for every run, whatever its algorithm (both
    sides of a comparison get them alike)."""
    # imported here: validate imports the algorithms, which this module's importers may still be loading
    from algorithms import ALGORITHMS
    from algorithms.schema import fill_missing, values_before
    from benchmarks.engine.validate import EnvConfig, RunConfig, TokenTaskEnvConfig

    later_algo_keys: dict = {}
    for algorithm in ALGORITHMS.values():
        for name, value in values_before(algorithm.Config).items():
            assert later_algo_keys.get(name, value) == value, f"two schemas say algo.{name} was {value} and " \
                                                              f"{later_algo_keys[name]} before it existed"
            later_algo_keys[name] = value
    token_task = config.get("env", {}).get("family") == "rlhf"  # a token task's own keys, on its runs only
    later = {**values_before(RunConfig), "env": values_before(TokenTaskEnvConfig if token_task else EnvConfig),
             "algo": later_algo_keys}
    return fill_missing(config, {name: value for name, value in later.items() if value != {}})


def task_kwargs(env_cfg) -> dict | None:
    """The task's own constructor arguments (env.kwargs; the token tasks': reward, temperature, ...)."""
    return OmegaConf.to_container(env_cfg.kwargs, resolve=True) if "kwargs" in env_cfg else None


def task_network(env_cfg) -> dict | None:
    """The task's policy network (env.network; None: the MLP of algo.hidden_sizes), its init_from a directory."""
    if "network" not in env_cfg:
        return None
    network = OmegaConf.to_container(env_cfg.network, resolve=True)
    if "init_from" in network:  # token tasks only (the [rlhf] extra)
        from benchmarks.rlhf.models import resolve_init_from

        network["init_from"] = resolve_init_from(network["init_from"])
    return network


def numbers_relevant(config: dict) -> dict:
    """The config without what cannot change a logged number: logging switches and score metadata."""
    config = {k: v for k, v in with_later_keys(config).items() if k not in ("logging", "restart", "pause_at_steps")}
    # env.hparams and env.tuned are where the presets read their values from; the values used are in config["algo"].
    config["env"] = {k: v for k, v in config["env"].items()
                     if k not in ("random_score", "reference_score", "hparams", "tuned")}
    return config


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


def load_checkpoint(run_dir: Path, cfg: DictConfig) -> dict | None:
    """The newest readable checkpoint of this config in run_dir, None if there is none.

    A truncated or unreadable newest file falls back to the previous one; if
    checkpoints exist but none is usable, CheckpointError: never train on garbage.
    """
    problems = []
    for name in CHECKPOINT_FILES:
        path = run_dir / name
        if not path.exists():
            continue
        try:
            checkpoint = read_checkpoint(path)
            if not isinstance(checkpoint, dict) or checkpoint.get("format") != CHECKPOINT_FORMAT:
                raise ValueError(f"not a format-{CHECKPOINT_FORMAT} checkpoint")
        except Exception as error:  # torch raises several types for a damaged zip/pickle
            problems.append(f"{name} is unreadable ({type(error).__name__}: {str(error).splitlines()[0][:120]})")
            continue
        if numbers_relevant(checkpoint["config"]) != numbers_relevant(OmegaConf.to_container(cfg, resolve=True)):
            raise CheckpointError(f"{path} was written with a different config; choose another run directory "
                                  f"or delete this one")
        written_in = numerics.base_mode(checkpoint.get("numerics", "native"))  # older checkpoints: native
        if written_in != numerics.base_mode(numerics.MODE):
            raise CheckpointError(f"{path} was written with {written_in} float kernels and this process has "
                                  f"{numerics.base_mode(numerics.MODE)} ones: rerun with "
                                  f"{numerics.MODE_VARIABLE}={written_in} to resume it exactly")
        for problem in problems:
            print(f"warning: {problem}; resuming from {name}", file=sys.stderr)
        if problems and name == CHECKPOINT_FILES[1]:
            # The damaged newest is set aside and the good one takes its place, so that the next save
            # rotates a good checkpoint into the fallback slot, not the damaged one.
            newest = run_dir / CHECKPOINT_FILES[0]
            if newest.exists():
                os.replace(newest, run_dir / (CHECKPOINT_FILES[0] + ".damaged"))
            os.replace(path, newest)
        return checkpoint
    if problems:
        raise CheckpointError(f"{run_dir}: " + "; ".join(problems) + ". Delete the run directory to start over")
    return None


def save_checkpoint(checkpoint: dict, run_dir: Path) -> None:
    """Atomic, keeping the previous checkpoint as a fallback: a kill at any instant leaves one whole file."""
    newest, previous = (run_dir / name for name in CHECKPOINT_FILES)
    if newest.exists():
        os.replace(newest, previous)
    save_checkpoint_file(checkpoint, newest)


def pack_rng(python_state, numpy_state, torch_state: torch.Tensor) -> dict:
    """Random states as a checkpoint stores them (tensors and plain values: weights_only-loadable)."""
    name, keys, position, has_gauss, cached_gaussian = numpy_state
    return {"python": python_state, "torch": torch_state,
            "numpy": (name, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached_gaussian)}


def unpack_rng(state: dict) -> tuple:
    """pack_rng's inverse: (python state, numpy state, torch state)."""
    version, internal, gauss = state["python"]
    name, keys, position, has_gauss, cached_gaussian = state["numpy"]
    return ((version, tuple(internal), gauss),
            (name, keys.numpy().astype(np.uint32), position, has_gauss, cached_gaussian), state["torch"])


def rng_states() -> dict:
    return pack_rng(random.getstate(), np.random.get_state(), torch.get_rng_state())


def load_rng_states(state: dict) -> None:
    python_state, numpy_state, torch_state = unpack_rng(state)
    random.setstate(python_state)
    np.random.set_state(numpy_state)
    torch.set_rng_state(torch_state)


def check_finite(algorithm, stats: dict, iteration: int, env_steps: int) -> None:
    where = f"at iteration {iteration} ({env_steps} env steps)"
    for key in algorithm.guarded_stats:
        if key in stats and not math.isfinite(stats[key]):
            raise NonFiniteError(f"non-finite {key} ({stats[key]}) {where}; the last good checkpoint is kept")
    for name, parameter in algorithm.named_parameters():
        if not torch.isfinite(parameter).all():
            raise NonFiniteError(f"non-finite parameter {name} {where}; the last good checkpoint is kept")


class RunLockedError(RuntimeError):
    """Another live process is training in this run directory."""


@contextlib.contextmanager
def run_lock(run_dir: Path):
    """Hold run_dir/.lock for as long as this process trains there; a second process is refused.

    flock: the kernel releases it when the holder exits, however it exits (kill -9 included),
    so a stale lock never blocks a resume.
    """
    import fcntl

    path = run_dir / ".lock"
    while True:
        handle = open(path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise RunLockedError(f"{run_dir} is being trained by another process (pid {holder}); wait for it to "
                                 f"finish, or choose another run directory") from None
        # The holder before us removes the file as it releases it: a lock taken on a removed file is no lock.
        try:
            on_disk = os.stat(path)
        except FileNotFoundError:
            on_disk = None
        held = os.fstat(handle.fileno())
        if on_disk is not None and (on_disk.st_dev, on_disk.st_ino) == (held.st_dev, held.st_ino):
            break
        handle.close()
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        yield
    finally:
        path.unlink(missing_ok=True)  # still held: no other process can have taken it; nothing stays behind
        handle.close()


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

        summaries = train_batch(cfg, [run_dir], [cfg.seed])
        if not summaries:
            raise NonFiniteError(f"{run_dir}: the run stopped on a non-finite number (see its summary.json)")
        return summaries[0]
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


def save_atomic(obj, path: Path) -> None:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    write_bytes_atomic(path, buffer.getvalue())  # a failed write leaves no temp file; a full disk is one line


def save_checkpoint_file(checkpoint: dict, path: Path) -> None:
    """The checkpoint serialised, with the SHA-256 of its bytes beside it in the same file (atomic):
    flipped bytes that torch.load would still read are caught by read_checkpoint."""
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    payload = buffer.getvalue()
    save_atomic({"sha256": hashlib.sha256(payload).hexdigest(), "payload": payload}, path)


def read_checkpoint(path: Path) -> dict:
    """save_checkpoint_file's inverse; ValueError if the bytes do not match their digest.
    (Checkpoints written before the digest existed are the checkpoint itself, read as they are.)"""
    stored = torch.load(path, weights_only=True)
    if isinstance(stored, dict) and set(stored) == {"sha256", "payload"}:
        if hashlib.sha256(stored["payload"]).hexdigest() != stored["sha256"]:
            raise ValueError("its bytes do not match their SHA-256 digest (damaged on disk)")
        return torch.load(io.BytesIO(stored["payload"]), weights_only=True)
    return stored


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


def run_label(cfg) -> str:
    """Whose console lines these are: "<env> <algo> seed <k>"."""
    return f"{cfg.env.name} {cfg.algo.name} seed {cfg.seed}"


def machine() -> dict:
    """The CPU a run's numbers were computed on, and the kernels its libraries chose for it: float results
    differ between instruction sets (torch and numpy dispatch AVX2 or AVX-512 kernels at run time), so a
    rerun reproduces bit for bit only where these agree (benchmarks/reproduce.py says when they do not)."""
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    kernels = numerics.kernel_record()  # portable or native kernels, and what each library chose
    return {
        "cpu": cpu,
        "torch_cpu_capability": kernels["torch_cpu_capability"],
        "numpy_simd": kernels["numpy_simd"],
        "numpy_blas": np.show_config(mode="dicts").get("Build Dependencies", {}).get("blas", {}).get("name"),
        "numerics": kernels,
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
