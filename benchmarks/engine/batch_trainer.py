"""The training loop: a population of seeds of one configuration trained in lockstep (`seeds=[0,1,2,3]`),
a single run being a population of one (benchmarks/engine/trainer.py train()).

Each seed is a normal run: its own run directory (`<job dir>/../seed<k>`, where a single-seed
run of it would write), its own envs, evaluator, logs, TensorBoard file, checkpoints and
summary, so the report, claims and the regression check read every run alike. What is shared: the
loop, and on the compiled engine one act call per env step for all seeds and one update program. The
summary's "batched" entry records the population.

The loop is written once; what it drives comes in two kinds, chosen by algo.backend:

    compiled (default)  PopulationBatch (algorithms/population.py: the algorithm's torch loss over the
                        seed axis, compiled), LockstepEnvs and LockstepStatistics ([seeds, envs] arrays)
    torch (eager)       EagerPopulation (each seed's own act and update), PerSeedEnvs (each seed's
                        Gymnasium vector env through its wrappers: token tasks' same-step resets and step
                        infos) and PerSeedStatistics (each seed's own normaliser objects)

Checkpoints: every seed writes its own at the same iteration. A kill can land between two
seeds' writes; on resume every seed is rolled back to the newest iteration all of them
have (a seed ahead uses its previous checkpoint), so the batch resumes in lockstep and
each seed's numbers equal an uninterrupted batched run's.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import random
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from algorithms import build_algorithm
from algorithms.core import ObservationNormalizer, RewardScaler, Rollout, clip_symmetric, merge_moments, merge_one_row
from algorithms.population import EagerPopulation, PopulationBatch
from benchmarks import numerics
from benchmarks.engine import classic_batch
from benchmarks.engine.checkpoint import (
    CHECKPOINT_FILES,
    CHECKPOINT_FORMAT,
    CheckpointError,
    load_checkpoint,
    load_rng_states,
    pack_rng,
    read_checkpoint,
    rng_states,
    save_checkpoint,
    unpack_rng,
)
from benchmarks.engine.config import numbers_relevant, task_kwargs, task_network
from benchmarks.engine.env_state import load_vector_env_state, vector_env_state
from benchmarks.engine.envs import make_vector_env, space_dims, time_limit
from benchmarks.engine.logger import EPISODE_COLUMNS, CSVLog, RunLogger, write_json_atomic
from benchmarks.engine.mujoco_batch import BatchedLocomotion, batchable
from benchmarks.engine.reference_kl import EpisodeInfoMeans, ReferenceKLPenalty, whiten_rewards
from benchmarks.engine.run_dir import algorithm_source, git_commit, machine, run_label, run_lock, versions
from benchmarks.engine.trainer import (
    NonFiniteError,
    PhaseTimes,
    PreemptionSignals,
    TrainingInterrupted,
    check_finite,
    final_metrics,
    log_iteration,
    make_evaluator,
    pause_requested,
    seed_everything,
)


class NumpyStream:
    """numpy's global stream (the legacy RandomState's), swapped exactly and cheaply.

    np.random.get_state and set_state copy MT19937's 624 words one at a time, in Python-level code: a swap through
    them costs about as much as a block of PPO's own code. The words and their position are one C struct of the bit
    generator, whose address numpy gives (MT19937.ctypes.state_address), copied here in one call. The RandomState's
    cached gaussian (legacy normal draws come in pairs) is not in it, so a swap copies the struct only where the two
    states' caches are equal, and goes through set_state where they differ. The state a swap replaces is read
    through get_state unless its words are those this class last set, with no gaussian cached: then nothing drew
    from it since (a draw moves the words; only set_state, restoring a state saved at the same words with a
    gaussian cached, could change the cache alone). A state here is (words: the struct's bytes, cache: (has_gauss,
    gauss)); `as_tuple` gives np.random.get_state's, types included (what checkpoints record).
    """

    WORDS = 624 * 4 + 4  # uint32 key[624]; int pos
    fast = True  # False: every swap through get_state and set_state (a test compares the two)

    def __init__(self):
        self.known = None  # the last state this class set as the global stream's
        self.laid_out_as_read: bool | None = None  # whether the struct holds what get_state gives, checked once

    @staticmethod
    def from_tuple(state: tuple) -> tuple:
        _name, keys, position, has_gauss, gauss = state
        return np.asarray(keys, np.uint32).tobytes() + np.int32(position).tobytes(), (int(has_gauss), float(gauss))

    @staticmethod
    def as_tuple(state: tuple) -> tuple:
        words, (has_gauss, gauss) = state
        return ("MT19937", np.frombuffer(words[:-4], np.uint32).copy(), int(np.frombuffer(words[-4:], np.int32)[0]),
                has_gauss, gauss)

    def address(self) -> int | None:
        """Where the global generator's words are; None where they cannot be copied (another bit generator, which
        get_state refuses too, or a struct laid out otherwise than get_state reads it): get_state and set_state then."""
        generator = np.random.get_bit_generator()
        if not self.fast or type(generator) is not np.random.MT19937:
            return None
        address = generator.ctypes.state_address
        if self.laid_out_as_read is None:
            self.laid_out_as_read = ctypes.string_at(address, self.WORDS) == self.from_tuple(np.random.get_state())[0]
        return address if self.laid_out_as_read else None

    def swap(self, state: tuple) -> tuple:
        """Installs `state` as the global stream's; returns the state it replaced."""
        address = self.address()
        known = self.known
        if address is not None and known is not None and known[1][0] == 0 and ctypes.string_at(
                address, self.WORDS) == known[0]:
            replaced = known  # nothing drew from it since it was known
        else:
            replaced = self.from_tuple(np.random.get_state())
        if address is not None and state[1] == replaced[1]:
            ctypes.memmove(address, state[0], self.WORDS)
        else:
            np.random.set_state(self.as_tuple(state))
        self.known = state
        return replaced


NUMPY_STREAM = NumpyStream()


class RandomState:
    """One seed's random streams: a torch generator for acting and shuffling, plus Python's and numpy's
    global states, swapped in around the seed's own update code (which draws from the global ones)."""

    def __init__(self):
        self.torch = torch.Generator()
        self.torch.set_state(torch.get_rng_state())  # continue where the global stream stands (after network init)
        self.python = random.getstate()
        self.numpy = NumpyStream.from_tuple(np.random.get_state())

    def __enter__(self) -> "RandomState":
        self.saved = (torch.get_rng_state(), random.getstate(), NUMPY_STREAM.swap(self.numpy))
        torch.set_rng_state(self.torch.get_state())
        random.setstate(self.python)
        return self

    def __exit__(self, *exc) -> None:
        torch_state, python_state, numpy_state = self.saved
        self.torch.set_state(torch.get_rng_state())
        self.python, self.numpy = random.getstate(), NUMPY_STREAM.swap(numpy_state)
        torch.set_rng_state(torch_state)
        random.setstate(python_state)

    def state_dict(self) -> dict:
        return pack_rng(self.python, NumpyStream.as_tuple(self.numpy), self.torch.get_state())

    def load_state_dict(self, state: dict) -> None:
        self.python, numpy_state, torch_state = unpack_rng(state)
        self.numpy = NumpyStream.from_tuple(numpy_state)
        self.torch.set_state(torch_state)


class ProcessStreams:
    """A single run's streams: the process's own global ones, as a plain script's (so that anything drawing from
    them - a task's own code included - draws in the order such a script would), with nothing to swap around the
    seed's code. Each seed of a population of two or more swaps its RandomState in and out around every block of
    its code; most of a swap's cost is Python's getstate and setstate (numpy's stream is swapped by NumpyStream)."""

    torch = torch.default_generator  # acting and shuffling draw from the global torch stream too

    def __enter__(self) -> "ProcessStreams":
        return self

    def __exit__(self, *exc) -> None:
        pass

    def state_dict(self) -> dict:
        return rng_states()

    def load_state_dict(self, state: dict) -> None:
        load_rng_states(state)


def seed_rollout(rollout: Rollout, index: int, num_envs: int) -> Rollout:
    """Seed `index`'s columns of a [steps, seeds x envs] rollout, as views."""
    columns = slice(index * num_envs, (index + 1) * num_envs)
    return Rollout(**{name: getattr(rollout, name)[:, columns] if name != "next_value" else
                      rollout.next_value[columns] for name in Rollout.__dataclass_fields__})


def task_models(envs) -> dict:
    """{"task_models": ...} where the env names the trained models its numbers are computed with (a token task's
    reference and reward model: build name and sha256 of the weights), else {}."""
    models = getattr(getattr(envs, "unwrapped", envs), "task_models", None)
    return {"task_models": models} if models else {}


def seed_run_dirs(job_dir: Path, seeds: list[int]) -> list[Path]:
    """Where each seed of a batch job writes. A job directory with the suite's own batch name (conf/config.yaml's
    seed_dir: seeds0-4) stands for its seeds, which sit beside it where single-seed runs of them would; a directory
    the user named (hydra.run.dir=/x/Swimmer) holds them (/x/Swimmer/seed0, ...), so that two batches given two
    directories never share seed directories."""
    from benchmarks.engine.validate import seed_dir

    job_dir = Path(job_dir)
    home = job_dir.parent if job_dir.name == seed_dir(None, seeds) else job_dir
    return [home / f"seed{seed}" for seed in seeds]


def seed_config(cfg: DictConfig, seed: int) -> DictConfig:
    """The config of one seed of the batch: seed set; `seeds` (the batch) kept, so it is part of the run's identity."""
    config = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    config.seed = seed
    return config


class SeedRun:
    """One seed of the population: its agent, envs, evaluator, random streams and logs, and the loop's position.

    What its checkpoint holds and a resume restores is written once (state_dict / load_state_dict): the agent
    (the algorithm with its networks, optimizers and buffers; the observation and reward statistics; a token
    task's KL penalty), the environments mid-episode (training and evaluation), the random streams, and the
    loop's position: the last completed iteration, env steps, the next evaluation, the last evaluation's row,
    training seconds so far, the phase timers, and the observation and episode-end flags the next step starts
    from.
    """

    def __init__(self, cfg: DictConfig, run_dir: Path, progress_bar: bool, own_streams: bool):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        env_cfg, algo_cfg = cfg.env, cfg.algo
        seed_everything(cfg.seed)  # network init draws what any run of this seed draws
        env_kwargs = task_kwargs(env_cfg)
        self.envs = make_vector_env(env_cfg.id, env_cfg.num_envs, cfg.seed, env_kwargs=env_kwargs)
        self.dims = space_dims(self.envs, env_cfg.id)
        obs_dim, action_dim, discrete, _ = self.dims
        self.num_iterations = cfg.total_steps // (env_cfg.num_envs * env_cfg.num_steps)
        self.algorithm = build_algorithm(algo_cfg.algorithm, obs_dim, action_dim, discrete, algo_cfg,
                                         self.num_iterations, network=task_network(env_cfg))
        self.obs_normalizer = ObservationNormalizer((obs_dim,), env_cfg.normalize_obs, clip=env_cfg.obs_clip)
        self.reward_scaler = RewardScaler(env_cfg.num_envs, algo_cfg.gamma, env_cfg.scale_reward,
                                          clip=env_cfg.reward_clip)
        # token tasks (RLHF): the per-token KL penalty to the reference model, and the task's per-episode numbers
        self.kl_penalty = ReferenceKLPenalty(env_cfg.kl_penalty, env_cfg.num_envs) if "kl_penalty" in env_cfg else None
        self.episode_infos = EpisodeInfoMeans()
        self.evaluator = make_evaluator(cfg, env_kwargs)
        self.config = OmegaConf.to_container(cfg, resolve=True)
        self.iteration = 0          # the last completed iteration
        self.env_steps = 0
        self.next_eval_at = cfg.eval.every_steps
        self.last_eval: dict | None = None
        self.resumed_at: list[int] = []  # env steps at which each resume started
        self.elapsed = 0.0          # training seconds before this process started
        self.phases = PhaseTimes()
        self.obs: np.ndarray | None = None  # normalised, float32
        # True where the previous step ended an episode: the coming step is a reset step.
        self.episode_ended = np.zeros(env_cfg.num_envs, dtype=bool)
        self.progress_bar = progress_bar
        self.active, self.error = True, None  # error: the NonFiniteError that stopped this seed
        # from here on the seed's own streams (each seed of a population), or the process's (a single run)
        self.randoms = RandomState() if own_streams else ProcessStreams()

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
            "rng": self.randoms.state_dict(),
            "envs": vector_env_state(self.envs),
            "eval_envs": vector_env_state(self.evaluator.envs),
            "eval_seed": self.evaluator.seed,
            "loop": {"obs": torch.from_numpy(self.obs.copy()), "episode_ended": torch.from_numpy(self.episode_ended.copy()),
                     "next_eval_at": self.next_eval_at, "last_eval": self.last_eval, "resumed_at": self.resumed_at,
                     "wall_time": wall_time, "phase_seconds": dict(self.phases.seconds)},
            "logs": log_sizes,  # bytes of each CSV log at this point: a resume cuts them back to it
        }

    def load_state_dict(self, checkpoint: dict) -> None:
        self.algorithm.load_state_dict(checkpoint["algorithm"])
        self.obs_normalizer.load_state_dict(checkpoint["obs_normalizer"])
        self.reward_scaler.load_state_dict(checkpoint["reward_scaler"])
        if self.kl_penalty is not None:
            self.kl_penalty.load_state_dict(checkpoint["kl_penalty"])
        load_vector_env_state(self.envs, checkpoint["envs"])
        load_vector_env_state(self.evaluator.envs, checkpoint["eval_envs"])
        self.evaluator.seed = checkpoint["eval_seed"]
        self.randoms.load_state_dict(checkpoint["rng"])
        loop = checkpoint["loop"]
        self.obs = loop["obs"].numpy().copy()
        self.episode_ended = loop["episode_ended"].numpy().copy()
        self.iteration, self.env_steps = checkpoint["iteration"], checkpoint["env_steps"]
        self.elapsed, self.last_eval, self.next_eval_at = loop["wall_time"], loop["last_eval"], loop["next_eval_at"]
        self.resumed_at = loop["resumed_at"] + [self.env_steps]
        self.phases.seconds.update(loop.get("phase_seconds") or {})  # absent from checkpoints made before the timers

    def start(self, checkpoint: dict | None) -> None:
        cfg = self.cfg
        if checkpoint is None:
            # logging.checkpoint=false over a run that checkpointed: its logs start again here, so a checkpoint
            # of the earlier logs goes (a later resume would cut these logs at that one's byte lengths)
            stale = [name for name in CHECKPOINT_FILES if (self.run_dir / name).exists()]
            for name in stale:
                (self.run_dir / name).unlink()
            if stale:
                print(f"note: {self.run_dir} trains from the start (logging.checkpoint=false): removed the earlier "
                      f"run's {', '.join(stale)}", file=sys.stderr)
            with self.randoms:
                raw_obs, _ = self.envs.reset(seed=cfg.seed)
            self.obs = np.asarray(self.obs_normalizer(raw_obs, update=True), dtype=np.float32)
            self.logger = RunLogger(self.run_dir, cfg.total_steps, cfg.logging.tensorboard, self.progress_bar,
                                    label=run_label(cfg))
            self.episodes_log = CSVLog(self.run_dir / "episodes.csv", header=EPISODE_COLUMNS)
        else:
            self.load_state_dict(checkpoint)
            logs = checkpoint["logs"]
            self.logger = RunLogger(self.run_dir, cfg.total_steps, cfg.logging.tensorboard, self.progress_bar,
                                    resume={"sizes": logs, "env_steps": self.env_steps}, label=run_label(cfg))
            self.episodes_log = CSVLog(self.run_dir / "episodes.csv", logs["episodes.csv"], header=EPISODE_COLUMNS)
            print(f"resuming {self.run_dir} from its checkpoint at {self.env_steps} env steps", file=sys.stderr)
        # wall_time counts the time of every segment of an interrupted run up to its checkpoint
        self.start_time = time.perf_counter() - self.elapsed
        self.episode_returns, self.episode_lengths = [], []

    def park(self, checkpoint: dict | None) -> None:
        """A seed that stopped on non-finite numbers, in a resumed population: its state from its newest good
        checkpoint (or its start), so that the population keeps its shape; inactive, it is neither stepped nor
        trained, and its logs and summary.json stay as they were written."""
        if checkpoint is None:
            with self.randoms:
                raw_obs, _ = self.envs.reset(seed=self.cfg.seed)
            self.obs = np.asarray(self.obs_normalizer(raw_obs, update=True), dtype=np.float32)
        else:
            self.load_state_dict(checkpoint)
        print(f"stopped, not resumed: {self.run_dir} ({self.error.removeprefix('NonFiniteError: ')})",
              file=sys.stderr)

    def evaluate(self, iteration: int) -> None:
        with self.randoms:  # any global draw an evaluator makes is the seed's (the suite's own make none)
            returns = self.evaluator(self.algorithm, self.obs_normalizer)
        self.last_eval = {
            "env_steps": self.env_steps,
            "iteration": iteration,
            "wall_time": time.perf_counter() - self.start_time,
            "eval_return_mean": float(returns.mean()),
            "eval_return_std": float(returns.std()),
            "eval_episodes": len(returns),
            **self.evaluator.columns,
        }
        self.logger.log_eval(self.last_eval)

    def rollout_stats(self) -> dict:
        """A token task's numbers of the rollout (its KL penalty's, the episodes' own); none for other tasks."""
        return {**(self.kl_penalty.end_rollout() if self.kl_penalty is not None else {}),
                **self.episode_infos.end_rollout()}

    def write_checkpoint(self, iteration: int) -> None:
        self.iteration = iteration
        save_checkpoint(self.state_dict(time.perf_counter() - self.start_time,
                                        {**self.logger.sizes(), "episodes.csv": self.episodes_log.size()}), self.run_dir)

    def write_summary(self, status: str, **fields) -> dict:
        """summary.json: what every summary says (complete, paused, interrupted, failed), then `fields`.
        wall_time_s is the run's training-loop wall time over all its segments so far (start_time is set back by
        the earlier ones): a study's CPU time."""
        started = getattr(self, "start_time", None)  # None: stopped before its loop started
        summary = {"status": status, "env": self.cfg.env.name, "algo": self.cfg.algo.name, "seed": self.cfg.seed,
                   "env_steps": self.env_steps, "resumed_at_env_steps": self.resumed_at,
                   **({"wall_time_s": time.perf_counter() - started} if started is not None else {}), **fields}
        write_json_atomic(self.run_dir / "summary.json", summary)
        return summary

    def close(self) -> None:
        for closing in (getattr(self, "logger", None), getattr(self, "episodes_log", None), self.envs, self.evaluator):
            if closing is not None:
                closing.close()


class LockstepEnvs:
    """Steps every seed's envs (make_vector_env stacks) as their wrappers would, without a Python call per layer.

    Per seed, make_vector_env builds [action clip] -> RecordEpisodeStatistics -> SyncVectorEnv
    (NEXT_STEP autoreset) -> sub-envs. Here the sub-envs are stepped directly, and what the
    vector layers do around them - one np.clip of all seeds' actions, the autoreset flags, the
    episode sums - is done once for all seeds on [seeds, envs] arrays, with the layers'
    semantics. The layers' own attributes are brought up to date before a checkpoint
    (`to_layers`) and read back after a resume (`from_layers`), so each seed's env state is
    saved and restored by benchmarks/engine/env_state.py exactly as a single-seed run's.

    With batched physics the sub-envs' state lives in one batch - MuJoCo's simulations in one
    mujoco.batch.Batch (benchmarks/engine/mujoco_batch.py), CartPole's states in one array
    (classic_batch.py) - and TimeLimit's counts in `elapsed`: between checkpoints the sub-envs'
    own state and counters are stale, and `to_layers` writes them back (the derived fields a
    MuJoCo task reads only after its step, such as contact forces, are the batch's).
    """

    same_step_reset = False  # NEXT_STEP autoreset: the step after an episode's end is a reset step
    infos = None  # the sub-envs' step infos are not kept (make_vector_env drops them: DropStepInfo)

    def __init__(self, vector_envs: list, batched_physics: bool | None = None):
        self.vector_envs = vector_envs
        self.sub_envs = [self.layer(envs, gym.vector.SyncVectorEnv).envs for envs in vector_envs]
        space = vector_envs[0].single_action_space
        self.bounds = (space.low, space.high) if isinstance(space, gym.spaces.Box) else None
        count, num_envs = len(vector_envs), len(self.sub_envs[0])
        # the MuJoCo locomotion tasks and CartPole step every sub-env's physics in one call where that gains
        # (benchmarks/engine/mujoco_batch.py, classic_batch.py); batched_physics (conf/config.yaml) True / False:
        # whenever the task allows / never
        self.physics = one_call_physics(self.sub_envs, batched_physics)
        if self.physics is not None:
            self.time_limits = [[time_limit(env) for env in row] for row in self.sub_envs]
        self.rewards = np.zeros((count, num_envs))
        self.terminated = np.zeros((count, num_envs), dtype=bool)
        self.truncated = np.zeros((count, num_envs), dtype=bool)
        self.raw_obs = np.zeros((count, num_envs) + vector_envs[0].single_observation_space.shape, np.float64)
        self.from_layers()

    @staticmethod
    def layer(envs, kind):
        while not isinstance(envs, kind):
            envs = envs.env
        return envs

    def from_layers(self) -> None:
        """Read the vector layers' state (after reset or a resume) into [seeds, envs] arrays."""
        stats = [self.layer(envs, gym.wrappers.vector.RecordEpisodeStatistics) for envs in self.vector_envs]
        self.autoreset = np.stack([self.layer(envs, gym.vector.SyncVectorEnv)._autoreset_envs
                                   for envs in self.vector_envs])
        self.episode_returns = np.stack([layer.episode_returns for layer in stats]).astype(np.float64)
        self.episode_lengths = np.stack([layer.episode_lengths for layer in stats])
        self.prev_dones = np.stack([layer.prev_dones for layer in stats])
        self.episode_count = np.array([layer.episode_count for layer in stats])
        if self.physics is not None:  # the sub-envs' state is the batch's from here on
            self.physics.load(range(len(self.physics.tasks)))
            self.elapsed = np.array([[limit._elapsed_steps for limit in row] for row in self.time_limits])
            self.max_steps = np.array([[limit._max_episode_steps for limit in row] for row in self.time_limits])

    def to_layers(self) -> None:
        """Write the arrays back into each seed's vector layers (before its env state is saved)."""
        for index, envs in enumerate(self.vector_envs):
            self.layer(envs, gym.vector.SyncVectorEnv)._autoreset_envs = self.autoreset[index].copy()
            stats = self.layer(envs, gym.wrappers.vector.RecordEpisodeStatistics)
            stats.episode_returns = self.episode_returns[index].copy()
            stats.episode_lengths = self.episode_lengths[index].copy()
            stats.prev_dones = self.prev_dones[index].copy()
            stats.episode_count = int(self.episode_count[index])
        if self.physics is not None:
            self.physics.store()
            for row, limits in zip(self.elapsed, self.time_limits):
                for elapsed, limit in zip(row, limits):
                    limit._elapsed_steps = int(elapsed)

    def step(self, actions: np.ndarray, active: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One step of every active seed's envs: the raw observations [seeds, envs, ...] and the mask of the
        episodes that ended ([seeds, envs]), whose return and length are in episode_returns/lengths."""
        raw_obs = self.raw_obs
        if self.bounds is not None:  # make_vector_env's clip, on its way into the env only
            actions = np.clip(actions, *self.bounds)
        if self.physics is not None:
            self.step_physics(actions, active)
        else:
            for index, sub_envs in enumerate(self.sub_envs):
                if not active[index]:
                    continue
                for j, env in enumerate(sub_envs):
                    if self.autoreset[index, j]:  # SyncVectorEnv's NEXT_STEP autoreset
                        raw_obs[index, j], _ = env.reset()
                        self.rewards[index, j], self.terminated[index, j], self.truncated[index, j] = 0.0, False, False
                    else:
                        (raw_obs[index, j], self.rewards[index, j], self.terminated[index, j],
                         self.truncated[index, j], _) = env.step(actions[index, j])
        dones = self.terminated | self.truncated
        # RecordEpisodeStatistics, NEXT_STEP: the reset step counts toward no episode, and its sums start at 0
        returns = np.where(self.prev_dones, 0.0, self.episode_returns + self.rewards)
        lengths = np.where(self.prev_dones, 0, self.episode_lengths + 1)
        if not active.all():  # a stopped seed's envs were not stepped: its arrays stay as they were
            on = active[:, None]
            returns, lengths = np.where(on, returns, self.episode_returns), np.where(on, lengths, self.episode_lengths)
            dones = np.where(on, dones, False)
            self.autoreset, self.prev_dones = np.where(on, dones, self.autoreset), np.where(on, dones, self.prev_dones)
        else:
            self.autoreset = self.prev_dones = dones
        self.episode_returns, self.episode_lengths = returns, lengths
        self.episode_count += dones.sum(axis=1)
        return raw_obs, dones

    def step_physics(self, actions: np.ndarray, active: np.ndarray) -> None:
        """The same step with the physics batched: resets through each sub-env's own reset(), then one batch
        step of every other active sub-env, with TimeLimit's count kept here."""
        num_envs = self.autoreset.shape[1]
        resetting = active[:, None] & self.autoreset
        if resetting.any():
            for index, j in zip(*np.nonzero(resetting)):
                self.raw_obs[index, j], _ = self.sub_envs[index][j].reset()
                self.physics.load([index * num_envs + j])
                self.elapsed[index, j] = 0
            self.rewards[resetting], self.terminated[resetting], self.truncated[resetting] = 0.0, False, False
        stepping = active[:, None] & ~self.autoreset
        if stepping.all():  # the common case, without masks
            obs, rewards, terminated = self.physics.step(None, actions.reshape(stepping.size, -1))
            self.raw_obs[...] = obs.reshape(self.raw_obs.shape)
            self.rewards[...], self.terminated[...] = rewards.reshape(stepping.shape), terminated.reshape(stepping.shape)
            self.elapsed += 1
            np.greater_equal(self.elapsed, self.max_steps, out=self.truncated)
        elif stepping.any():
            (self.raw_obs[stepping], self.rewards[stepping], self.terminated[stepping]) = self.physics.step(
                np.flatnonzero(stepping), actions.reshape(stepping.size, -1)[stepping.reshape(-1)])
            self.elapsed[stepping] += 1
            self.truncated[stepping] = self.elapsed[stepping] >= self.max_steps[stepping]


def one_call_physics(sub_envs: list[list[gym.Env]], batched_physics: bool | None):
    """The sub-envs' physics stepped in one call, where their task has such a step and batched_physics asks for it
    (None: from the sub-env count at which that batch measured faster than Gymnasium's step, its `gains_from`);
    else None: Gymnasium's step."""
    if batched_physics is False:
        return None
    batches = ((batchable, BatchedLocomotion), (classic_batch.batchable, classic_batch.BatchedCartPole))
    count = sum(len(row) for row in sub_envs)
    for steps_these_envs, batch in batches:
        if steps_these_envs(sub_envs):
            return batch(sub_envs) if batched_physics or count >= batch.gains_from else None
    return None


class PerSeedEnvs:
    """The eager path's env layer: each seed's Gymnasium vector env (make_vector_env) stepped through its own
    wrappers, one call per seed, inside the seed's random streams (so that a task drawing from the global ones
    draws in each seed what it draws alone) - any task, the token tasks' same-step resets and step infos
    included. The interface of LockstepEnvs; the wrappers keep their own state, so a checkpoint reads them."""

    def __init__(self, vector_envs: list, randoms: list):
        self.vector_envs, self.randoms = vector_envs, randoms
        # a SAME_STEP env (the token tasks) resets within the step that ends an episode: every step is valid
        self.same_step_reset = vector_envs[0].metadata.get("autoreset_mode") == gym.vector.AutoresetMode.SAME_STEP
        count, num_envs = len(vector_envs), vector_envs[0].num_envs
        self.terminated = np.zeros((count, num_envs), dtype=bool)
        self.truncated = np.zeros((count, num_envs), dtype=bool)
        self.episode_returns = np.zeros((count, num_envs))
        self.episode_lengths = np.zeros((count, num_envs), dtype=np.int64)
        # each seed's observations and rewards as its env returns them (in its own dtypes)
        self.raw_obs: list = [None] * count
        self.rewards: list = [np.zeros(num_envs) for _ in range(count)]
        self.infos: list[dict] = [{} for _ in range(count)]

    def to_layers(self) -> None:
        """Nothing cached outside the wrappers: they are the state a checkpoint reads."""

    def step(self, actions: np.ndarray, active: np.ndarray) -> tuple[list, np.ndarray]:
        ended = np.zeros(self.terminated.shape, dtype=bool)
        for index, envs in enumerate(self.vector_envs):
            if not active[index]:
                continue
            with self.randoms[index]:
                (self.raw_obs[index], self.rewards[index], self.terminated[index], self.truncated[index],
                 info) = envs.step(actions[index])
            self.infos[index] = info
            if "_episode" in info:  # RecordEpisodeStatistics: the episodes that ended at this step
                ended[index] = info["_episode"]
                self.episode_returns[index] = info["episode"]["r"]
                self.episode_lengths[index] = info["episode"]["l"]
        return self.raw_obs, ended


class LockstepStatistics:
    """Every seed's observation normaliser and reward scaler (algorithms/core.py), updated as [seeds, ...] arrays.

    The per-seed objects stay the source of truth for checkpoints and evaluation: `from_seeds`
    reads them (at the start and after a resume), `to_seeds` writes the arrays back (before
    each evaluation and checkpoint). The arithmetic is RunningMeanStd's and RewardScaler's,
    with a leading seed axis.
    """

    def __init__(self, runs: list):
        self.runs = runs
        self.normalize_obs, self.scale_reward = runs[0].obs_normalizer.enabled, runs[0].reward_scaler.enabled
        self.obs_clip, self.reward_clip = runs[0].obs_normalizer.clip, runs[0].reward_scaler.clip
        self.gamma = runs[0].reward_scaler.gamma
        self.obs_epsilon, self.reward_epsilon = runs[0].obs_normalizer.epsilon, runs[0].reward_scaler.epsilon
        self.from_seeds()

    def from_seeds(self) -> None:
        normalizers, scalers = [run.obs_normalizer for run in self.runs], [run.reward_scaler for run in self.runs]
        self.obs_mean = np.stack([n.rms.mean for n in normalizers])
        self.obs_var = np.stack([n.rms.var for n in normalizers])
        self.obs_count = np.array([n.rms.count for n in normalizers])
        self.return_mean = np.array([s.rms.mean for s in scalers], np.float64)
        self.return_var = np.array([s.rms.var for s in scalers], np.float64)
        self.return_count = np.array([s.rms.count for s in scalers])
        self.discounted_return = np.stack([s.discounted_return for s in scalers])

    def to_seeds(self) -> None:
        for index, run in enumerate(self.runs):
            rms = run.obs_normalizer.rms
            rms.mean, rms.var, rms.count = self.obs_mean[index].copy(), self.obs_var[index].copy(), float(self.obs_count[index])
            scaler = run.reward_scaler
            scaler.rms.mean, scaler.rms.var = np.float64(self.return_mean[index]), np.float64(self.return_var[index])
            scaler.rms.count = float(self.return_count[index])
            scaler.discounted_return = self.discounted_return[index].copy()

    def normalize(self, raw_obs: np.ndarray, active: np.ndarray) -> np.ndarray:
        """ObservationNormalizer(raw_obs, update=True) per seed: raw_obs [seeds, envs, obs] -> float32."""
        if not self.normalize_obs:
            return raw_obs.astype(np.float32)
        num_envs = raw_obs.shape[1]
        if num_envs == 1:  # RunningMeanStd's one-row path
            mean, var, count = merge_one_row(self.obs_mean, self.obs_var, self.obs_count[:, None], raw_obs[:, 0])
        else:
            mean, var, count = merge_moments(self.obs_mean, self.obs_var, self.obs_count[:, None],
                                             raw_obs.mean(axis=1), raw_obs.var(axis=1), num_envs)
        if active.all():
            self.obs_mean, self.obs_var, self.obs_count = mean, var, count[:, 0]
        else:  # a stopped seed's statistics stay as they were
            on = active[:, None]
            self.obs_mean, self.obs_var = np.where(on, mean, self.obs_mean), np.where(on, var, self.obs_var)
            self.obs_count = np.where(active, count[:, 0], self.obs_count)
        normalized = (raw_obs - self.obs_mean[:, None, :]) / np.sqrt(self.obs_var[:, None, :] + self.obs_epsilon)
        return clip_symmetric(normalized, self.obs_clip).astype(np.float32)

    def scale(self, rewards: np.ndarray, episode_ended: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """RewardScaler(rewards, episode_ended, valid) per seed, on [seeds, envs] arrays."""
        if not self.scale_reward:
            return rewards
        discounted = self.discounted_return * self.gamma + rewards
        if valid.all():  # every env of every seed took a step: no row to leave out
            self.discounted_return = discounted
            num_envs = valid.shape[1]
            if num_envs == 1:  # RunningMeanStd's one-row path (an infinite return too: its variance counts as 0)
                self.return_mean, self.return_var, self.return_count = merge_one_row(
                    self.return_mean, self.return_var, self.return_count, discounted[:, 0])
            else:
                batch_mean = discounted.sum(axis=1) / num_envs
                batch_var = ((discounted - batch_mean[:, None]) ** 2).sum(axis=1) / num_envs
                self.return_mean, self.return_var, self.return_count = merge_moments(
                    self.return_mean, self.return_var, self.return_count, batch_mean, batch_var, num_envs)
        else:  # reset steps (and stopped seeds) neither decay the return nor count; a seed with none keeps its moments
            self.discounted_return = np.where(valid, discounted, self.discounted_return)
            counts = valid.sum(axis=1)
            safe = np.maximum(counts, 1)
            batch_mean = np.where(valid, self.discounted_return, 0.0).sum(axis=1) / safe
            batch_var = np.where(valid, (self.discounted_return - batch_mean[:, None]) ** 2, 0.0).sum(axis=1) / safe
            mean, var, count = merge_moments(self.return_mean, self.return_var, self.return_count, batch_mean,
                                             batch_var, counts)
            some = counts > 0
            self.return_mean = np.where(some, mean, self.return_mean)
            self.return_var = np.where(some, var, self.return_var)
            self.return_count = np.where(some, count, self.return_count)
        scaled = rewards / np.sqrt(self.return_var[:, None] + self.reward_epsilon)
        self.discounted_return = np.where(episode_ended, 0.0, self.discounted_return)
        return clip_symmetric(scaled, self.reward_clip)


class PerSeedStatistics:
    """The eager path's statistics: each seed's own ObservationNormalizer and RewardScaler called on its own rows
    (the interface of LockstepStatistics; the objects are the state, so there is nothing to copy)."""

    def __init__(self, runs: list):
        self.runs = runs

    def to_seeds(self) -> None:
        """Nothing to write: the objects are the state."""

    def normalize(self, raw_obs: list, active: np.ndarray) -> np.ndarray:
        return np.stack([np.asarray(run.obs_normalizer(raw, update=True), dtype=np.float32) if on else run.obs
                         for run, raw, on in zip(self.runs, raw_obs, active)])

    def scale(self, rewards: list, episode_ended: np.ndarray, valid: np.ndarray) -> np.ndarray:
        return np.stack([run.reward_scaler(reward, ended, seed_valid)
                         for run, reward, ended, seed_valid in zip(self.runs, rewards, episode_ended, valid)])


class BatchPhaseTimes:
    """The loop's phase times (benchmarks/engine/trainer.py LOOP_PHASES), the batch's: every seed shares its loop."""

    def __init__(self, runs: list[SeedRun]):
        self.runs = runs

    def add(self, phase: str, seconds: float) -> None:
        for run in self.runs:
            run.phases.add(phase, seconds)


def stopped_on_non_finite(run_dir: Path, cfg: DictConfig | None = None) -> str | None:
    """The error of a run (a single run, or a population's seed that stopped alone) whose numbers went non-finite,
    as its summary.json records it (the loop below writes it), else None; given cfg, only a run of that config."""
    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    error = summary.get("error") if isinstance(summary, dict) and summary.get("status") == "failed" else None
    if not (isinstance(error, str) and error.startswith("NonFiniteError: ")):
        return None
    if cfg is not None and ("config" not in summary or numbers_relevant(summary["config"]) !=
                            numbers_relevant(OmegaConf.to_container(cfg, resolve=True))):
        return None  # another config's run (or one recorded without its config): not this one's result
    return error


def lockstep_checkpoints(runs: list[SeedRun], one_run: bool = False) -> list[dict | None]:
    """Each seed's checkpoint, all at the newest iteration every seed still training has (None for all: a fresh
    start). A seed of a population that stopped on non-finite numbers while the others went on stays stopped:
    it joins their resume inactive, from its own newest checkpoint (`SeedRun.park`), as the uninterrupted
    population carried it; a rerun would only stop it again where it stopped."""
    newest = [load_checkpoint(run.run_dir, run.cfg) if run.cfg.logging.checkpoint else None for run in runs]
    if all(checkpoint is None for checkpoint in newest):
        return newest
    for run in runs:
        run.error = None if one_run else stopped_on_non_finite(run.run_dir, run.cfg)
        run.active = run.error is None
    training = [(run, checkpoint) for run, checkpoint in zip(runs, newest) if run.active]
    if not training:
        raise NonFiniteError("every seed of the batch failed (see their summary.json)")
    if any(checkpoint is None for _, checkpoint in training):
        missing = [str(run.run_dir) for run, c in training if c is None]
        raise CheckpointError(f"a batch resumes all its seeds together, but {', '.join(missing)} has no "
                              f"checkpoint; delete the batch's run directories to start over")
    target = min(checkpoint["iteration"] for _, checkpoint in training)
    chosen = []
    for run, checkpoint in zip(runs, newest):
        if run.active and checkpoint["iteration"] != target:
            checkpoint = read_checkpoint(run.run_dir / CHECKPOINT_FILES[1])
            if checkpoint.get("iteration") != target:
                raise CheckpointError(f"{run.run_dir}: no checkpoint at iteration {target}, where the batch's "
                                      f"other seeds stand; delete the batch's run directories to start over")
        chosen.append(checkpoint)
    return chosen


def train_batch(cfg: DictConfig, run_dirs: list[Path], seeds: list[int] | None = None,
                one_run: bool = False, announce: Callable[[], None] | None = None) -> list[dict]:
    """Train `seeds` (default: all of cfg.seeds) for cfg.total_steps env steps in lockstep, seed k into
    run_dirs[k]; one summary per seed that completed (a seed whose numbers went non-finite stops alone).
    one_run: a single run (train()'s population of one), whose error is the run's own, said once by its caller.
    announce: called once the run directories are this process's (locked) and hold no checkpoint of another
    config - run.py's "training ..." line, which a refused process would otherwise write into the log of the run
    that refused it."""
    seeds = list(cfg.seeds) if seeds is None else list(seeds)
    with contextlib.ExitStack() as locks:
        for run_dir in run_dirs:
            Path(run_dir).mkdir(parents=True, exist_ok=True)
            locks.enter_context(run_lock(Path(run_dir)))
        return train_batch_locked(cfg, run_dirs, seeds, one_run, announce)


def train_batch_locked(cfg: DictConfig, run_dirs: list[Path], seeds: list[int], one_run: bool = False,
                       announce: Callable[[], None] | None = None) -> list[dict]:
    commit = git_commit()
    torch.set_num_threads(cfg.torch_threads)
    if cfg.algo.backend not in ("compiled", "torch"):
        raise ValueError(f"algo.backend must be compiled or torch, got {cfg.algo.backend!r}")
    compiled = cfg.algo.backend == "compiled"
    # each seed its own random streams, except a single run: it draws from the process's, as a script does
    own_streams = len(seeds) > 1
    runs = [SeedRun(seed_config(cfg, seed), run_dir, progress_bar=cfg.logging.progress_bar and index == 0,
                    own_streams=own_streams) for index, (seed, run_dir) in enumerate(zip(seeds, run_dirs))]
    algorithms, randoms = [run.algorithm for run in runs], [run.randoms for run in runs]
    env_cfg = cfg.env
    num_envs, num_steps = env_cfg.num_envs, env_cfg.num_steps
    steps_per_iteration = num_envs * num_steps
    num_iterations = runs[0].num_iterations
    obs_dim, _, _, action_shape = runs[0].dims
    rollout = Rollout.allocate(num_steps, len(runs) * num_envs, obs_dim, action_shape)
    rollouts = [seed_rollout(rollout, index, num_envs) for index in range(len(runs))]
    # "program": compiled, or eager (POPULATION_COMPILE=0, or no C++ compiler): they round differently, so a rerun
    # that must give the same numbers runs the same way (benchmarks/reproduce.py)
    batched_info = {"seeds": list(cfg.seeds) if cfg.seeds is not None else seeds, "trained_together": seeds}

    try:
        # compiled: the algorithm's torch loss over the seed axis (algorithms/population.py); torch: each seed's own
        # code. Inside the try: a population refused here (LossReadError) is recorded in each seed's summary.
        population = PopulationBatch(algorithms, randoms) if compiled else EagerPopulation(algorithms, randoms)
        batched_info["program"] = population.mode
        checkpoints = lockstep_checkpoints(runs, one_run)  # refuses another config's checkpoint
        if announce is not None:
            announce()
        for run, checkpoint in zip(runs, checkpoints):
            if run.active:
                run.start(checkpoint)
            else:
                run.park(checkpoint)
        population.optimizer_from_seeds()
        leader = next(run for run in runs if run.active)  # where every training seed stands
        start_iteration = leader.iteration + 1
        checkpoint_every = cfg.logging.checkpoint_every_steps
        next_checkpoint_at = (leader.env_steps // checkpoint_every + 1) * checkpoint_every

        # [steps, seeds, envs, ...] numpy views of the rollout's columns
        def columns(tensor: torch.Tensor) -> np.ndarray:
            array = tensor.numpy()
            return array.reshape((num_steps, len(runs), num_envs) + array.shape[2:])

        obs_np, actions_np, log_probs_np, values_np = (columns(t) for t in
                                                       (rollout.obs, rollout.actions, rollout.log_probs, rollout.values))
        rewards_np, raw_rewards_np = columns(rollout.rewards), columns(rollout.raw_rewards)
        terminated_np, truncated_np, valid_np = (columns(t) for t in
                                                 (rollout.terminated, rollout.truncated, rollout.valid))
        if compiled:
            envs = LockstepEnvs([run.envs for run in runs], batched_physics=cfg.get("batched_physics"))
            statistics = LockstepStatistics(runs)
        else:
            envs, statistics = PerSeedEnvs([run.envs for run in runs], randoms), PerSeedStatistics(runs)
        kl_penalties = [run.kl_penalty for run in runs]
        kl_penalized = any(penalty is not None for penalty in kl_penalties)
        phases = BatchPhaseTimes(runs)
        obs = np.stack([run.obs for run in runs])  # [seeds, envs, obs_dim], normalised
        episode_ended = np.stack([run.episode_ended for run in runs])
        with PreemptionSignals(checkpointed=bool(cfg.logging.checkpoint)) as signals:
            if start_iteration == 1 and cfg.eval.at_start:  # inside the signal guard: a signal here stops after iteration 1
                started = time.perf_counter()
                for run in runs:
                    run.evaluate(0)
                phases.add("evaluation", time.perf_counter() - started)
            for iteration in range(start_iteration, num_iterations + 1):
                if pause_requested(cfg, (iteration - 1) * steps_per_iteration, iteration - 1, num_iterations):
                    # checkpointed where it paused (below), or resumed from a checkpoint already past the pause
                    return [run.write_summary("paused", total_steps=cfg.total_steps, batched=batched_info,
                                              config=run.config) for run in runs if run.active]
                iteration_start = time.perf_counter()
                active = np.array([run.active for run in runs])
                all_active = bool(active.all())
                for run in runs:
                    run.episode_returns, run.episode_lengths = [], []
                act_time = step_time = scaling_time = normalising_time = 0.0
                with population.unchecked_calls():  # guards checked on each program's first call of the rollout
                    for t in range(num_steps):
                        before_act = time.perf_counter()
                        # NEXT_STEP autoreset: the step after an episode ends is a reset that ignores its action
                        # (valid False); a SAME_STEP env (the token tasks) resets within the step that ends one
                        resetting = np.zeros_like(episode_ended) if envs.same_step_reset else episode_ended
                        valid = ~resetting if all_active else ~resetting & active[:, None]
                        # a NaN the env returned is named after the iteration (check_finite); until then the policy
                        # acts on zeros in its place (a sampler given NaN probabilities raises mid-rollout)
                        action, log_prob, value = population.act(
                            obs if np.isfinite(obs).all() else np.nan_to_num(obs, nan=0.0, posinf=0.0, neginf=0.0),
                            active)
                        obs_np[t], actions_np[t], log_probs_np[t], values_np[t] = obs, action, log_prob, value
                        valid_np[t] = valid
                        before_step = time.perf_counter()
                        raw_obs, ended = envs.step(action, active)
                        episode_ended = envs.terminated | envs.truncated
                        after_step = time.perf_counter()
                        raw_rewards_np[t] = envs.rewards
                        rewards = envs.rewards
                        if kl_penalized:  # token tasks: the reward learnt from is score - beta * log(pi / pi_ref)
                            rewards = [penalty(reward, log_probs_np[t, index], envs.infos[index]["ref_log_prob"],
                                               valid[index], episode_ended[index]) if penalty is not None else reward
                                       for index, (penalty, reward) in enumerate(zip(kl_penalties, rewards))]
                        rewards_np[t] = statistics.scale(rewards, episode_ended, valid)
                        terminated_np[t], truncated_np[t] = envs.terminated, envs.truncated
                        after_scaling = time.perf_counter()
                        obs = statistics.normalize(raw_obs, active)
                        act_time += before_step - before_act
                        step_time += after_step - before_step
                        scaling_time += after_scaling - after_step
                        normalising_time += time.perf_counter() - after_scaling
                        if envs.infos is not None:  # a task's own per-episode numbers (the token tasks' judge)
                            for run, info in zip(runs, envs.infos):
                                run.episode_infos.add(info)
                        if ended.any():
                            for index, j in zip(*np.nonzero(ended)):
                                runs[index].episode_returns.append(float(envs.episode_returns[index, j]))
                                runs[index].episode_lengths.append(int(envs.episode_lengths[index, j]))
                        if signals.arrived:  # acted on after the iteration; a Ctrl-C is answered now
                            signals.say_ctrl_c()
                    # V(obs after the last row), the bootstrap of every seed's rollout
                    rollout.next_value.copy_(torch.from_numpy(population.value(obs).reshape(-1)))
                # the per-seed objects are what evaluation and checkpoints read
                statistics.to_seeds()
                for index, run in enumerate(runs):
                    run.obs, run.episode_ended = obs[index], episode_ended[index]
                if env_cfg.get("whiten_rewards", False):  # TRL's option (benchmarks/engine/reference_kl.py)
                    for part in rollouts:
                        whiten_rewards(part.rewards, part.valid)
                update_start = time.perf_counter()
                with population.unchecked_calls():
                    all_stats = population.update(rollouts, iteration, [run.active for run in runs])
                signals.say_ctrl_c()
                now = time.perf_counter()
                phases.add("act", act_time)
                phases.add("env step", step_time)
                phases.add("reward scaling", scaling_time)
                phases.add("observation normalisation", normalising_time)
                phases.add("update", now - update_start)
                evaluation_time = 0.0
                for run, stats, seed_part in zip(runs, all_stats, rollouts):
                    if not run.active:
                        continue
                    run.env_steps += steps_per_iteration
                    try:
                        check_finite(run.algorithm, stats, iteration, run.env_steps, seed_part, run.obs)
                    except NonFiniteError as error:  # this seed stops; the others go on
                        run.active, run.error = False, error
                        run.write_summary("failed", error=f"NonFiniteError: {error}", batched=batched_info,
                                          config=run.config)
                        if not one_run:  # a single run's caller says it once, as the run's own error (below)
                            print(f"error: {run.run_dir}: {error}", file=sys.stderr)
                        continue
                    stats = {**stats, **run.rollout_stats()}
                    # times are the batch's; sps is this seed's steps over the batch's iteration time
                    log_iteration(run.logger, run.episodes_log, stats, run.env_steps, iteration, run.episode_returns,
                                  run.episode_lengths, times=(run.start_time, iteration_start, update_start, now),
                                  steps_per_iteration=steps_per_iteration)
                    if run.env_steps >= run.next_eval_at or iteration == num_iterations:
                        started = time.perf_counter()
                        run.evaluate(iteration)
                        evaluation_time += time.perf_counter() - started
                        while run.next_eval_at <= run.env_steps:
                            run.next_eval_at += cfg.eval.every_steps
                phases.add("evaluation", evaluation_time)
                phases.add("logging and checkpoints", time.perf_counter() - now - evaluation_time)
                env_steps = iteration * steps_per_iteration
                interrupted = signals.received is not None  # after the evaluations: one during them acts now
                pausing = pause_requested(cfg, env_steps, iteration, num_iterations)
                if cfg.logging.checkpoint and (env_steps >= next_checkpoint_at or interrupted or pausing
                                               or iteration == num_iterations):
                    checkpoint_start = time.perf_counter()
                    envs.to_layers()
                    population.optimizer_to_seeds()
                    for run in runs:
                        if run.active:
                            run.write_checkpoint(iteration)
                    while next_checkpoint_at <= env_steps:
                        next_checkpoint_at += checkpoint_every
                    phases.add("logging and checkpoints", time.perf_counter() - checkpoint_start)
                if not any(run.active for run in runs):
                    if signals.received is not None:  # the process still stops (each failure is recorded)
                        signals.hand_over(env_steps, f"the run stopped in ({runs[0].error})" if one_run else
                                          "every seed of the batch stopped in (see their summary.json)")
                    if one_run:
                        raise runs[0].error
                    raise NonFiniteError("every seed of the batch failed (see their summary.json)")
                if interrupted and iteration < num_iterations:
                    for run in runs:
                        if run.active:
                            run.write_summary("interrupted", signal=signal.Signals(signals.received).name,
                                              checkpointed=signals.checkpointed, batched=batched_info)
                    signals.hand_over(env_steps)
        for run in runs:
            if run.active:
                run.logger.log_hparams(run.config, final_metrics(run.last_eval))
    except Exception as error:
        if not isinstance(error, TrainingInterrupted):
            for run in runs:
                if run.active:
                    run.write_summary("failed", error=f"{type(error).__name__}: {error}", batched=batched_info)
        raise
    finally:
        for run in runs:
            run.close()

    summaries = []
    # a module:Class of one's own: its module's file and hash beside the commit, which may not hold it
    source = {"algorithm_source": algorithm_source(cfg.algo.algorithm)} if ":" in cfg.algo.algorithm else {}
    for run in [run for run in runs if run.active]:
        wall_time = time.perf_counter() - run.start_time  # the loop's time over every segment
        summaries.append(run.write_summary(
            "complete", wall_time_s=wall_time, iterations=num_iterations,
            final_eval_return_mean=run.last_eval["eval_return_mean"] if run.last_eval else None,
            final_eval_return_std=run.last_eval["eval_return_std"] if run.last_eval else None,
            sps=run.env_steps / wall_time,  # this seed's steps; the batch stepped len(seeds) times as many
            phase_seconds=run.phases.seconds,  # the batch's: every seed shares its loop
            batched=batched_info, versions=versions(), machine=machine(), git_commit=commit, config=run.config,
            **source, **task_models(run.envs)))
    if signals.received is not None:  # it arrived in the last iteration: the run completed, the process stops
        env_steps = num_iterations * steps_per_iteration
        signals.hand_over(env_steps, f"the run completed in ({env_steps} env steps); rerunning the command skips it")
    return summaries
