"""Many seeds in one process (seeds=[...]; benchmarks/engine/batch_trainer.py): kill -9 resumes a batch exactly, a
sweep packs seeds into batched jobs, what a batch cannot run is refused in one line, and an eager population
(algo.backend=torch) logs for each seed what the seed logs alone, bit for bit. That seed i of a batch
takes the update it takes alone is tests/test_population.py's."""

from __future__ import annotations

import contextlib
import json
import signal
import sys

import pytest
import torch

from benchmarks.engine.batch_trainer import train_batch
from benchmarks.engine.checkpoint import read_checkpoint, rng_states
from benchmarks.engine.config import compose_config
from benchmarks.engine.trainer import train
from tests.commands import run_python
from tests.conftest import QUIET, ROOT, SMALL_UPDATE, assert_identical_logs
from tests.test_resume import assert_same_metrics, launch, wait_for_rows

# 8 iterations of 512 steps per seed, a checkpoint after each; the family's own values (as SMALL_RUN)
SMALL_BATCH = ["env=CartPole", "env_family/values@env=shipped", "seeds=[0,1,2]",
               "total_steps=4096", "eval.every_steps=1024", "eval.episodes=2", "logging.checkpoint_every_steps=512",
               "logging.progress_bar=false"]


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ppo", "hp3o", "ppo+torch"])
def test_sigkill_mid_batch_then_rerun_logs_the_uninterrupted_numbers_for_every_seed(algo, tmp_path):
    preset, _, backend = algo.partition("+")  # +torch: an eager population (each seed's own streams checkpointed)
    overrides = [f"algo={preset}", *([f"algo.backend={backend}"] if backend else []), *SMALL_BATCH]
    train_batch(compose_config(overrides), [tmp_path / "reference" / f"seed{s}" for s in (0, 1, 2)])  # in this process
    victim = launch(overrides, tmp_path / "killed" / "job")
    wait_for_rows(tmp_path / "killed" / "job" / "seed2", 5, victim)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    # A kill can land between two seeds' checkpoint writes, leaving a seed one checkpoint behind the others;
    # if this one did not, seed 1 is put there.
    newest = [read_checkpoint(path)["iteration"] if path.exists() else None  # None: killed mid-write
              for path in (tmp_path / "killed" / "job" / f"seed{s}" / "checkpoint.pt" for s in range(3))]
    if len(set(newest)) == 1 and None not in newest:
        seed1 = tmp_path / "killed" / "job" / "seed1"
        (seed1 / "checkpoint.prev.pt").replace(seed1 / "checkpoint.pt")
    resumed = launch(overrides, tmp_path / "killed" / "job")
    _, stderr = resumed.communicate()
    assert resumed.returncode == 0, stderr
    for seed in (0, 1, 2):
        assert_same_metrics(tmp_path / "reference" / f"seed{seed}", tmp_path / "killed" / "job" / f"seed{seed}")
        assert json.loads((tmp_path / "killed" / "job" / f"seed{seed}" / "summary.json").read_text())["resumed_at_env_steps"]


@pytest.mark.slow
def test_a_sweep_packs_seeds_into_batched_jobs_in_the_directories_of_single_seed_runs(tmp_path):
    command = [sys.executable, str(ROOT / "run.py"), "-m", "algo=ppo", "env=CartPole",
               "seeds=[0,1],[2,3]", "total_steps=1024", "eval.every_steps=1024", "eval.episodes=1",
               "logging.progress_bar=false", f"hydra.sweep.dir={tmp_path}"]
    result = run_python(command, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    for seed in range(4):
        summary = json.loads((tmp_path / "CartPole" / "ppo" / f"seed{seed}" / "summary.json").read_text())
        assert summary["status"] == "complete" and summary["seed"] == seed
        assert summary["batched"]["seeds"] == [seed - seed % 2, seed - seed % 2 + 1]
    assert sorted(p.name for p in (tmp_path / "CartPole" / "ppo").iterdir()) == [
        "seed0", "seed1", "seed2", "seed3", "seeds0-1", "seeds2-3"]
    # rerunning skips the complete seeds
    again = run_python(command, cwd=ROOT, capture_output=True, text=True)
    output = again.stdout + again.stderr
    assert again.returncode == 0 and output.count("already complete, skipped") == 4, output[-2000:]


@pytest.mark.parametrize("override,message", [
    (["seeds=[0,0]"], "seeds must be null (one seed, `seed`) or a list of distinct integers"),
])
def test_a_batch_the_fast_path_cannot_run_is_refused_in_one_line(override, message, tmp_path):
    result = run_python([sys.executable, str(ROOT / "run.py"), *override, f"hydra.run.dir={tmp_path}/job"],
                        cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 2
    assert message in result.stderr and result.stderr.count("\n") == 1, result.stderr


@pytest.mark.parametrize("task", [
    ["env=CartPole", "algo=ppo_kl", "algo.target_kl=0.01"],  # each seed's own early stopping
    ["env=Pendulum", "algo=outer_ppo_biased"],
])
@pytest.mark.slow
def test_seed_i_of_an_eager_population_logs_what_it_logs_alone_bit_for_bit(task, tmp_path):
    """algo.backend=torch, seeds=[...]: the one loop runs each seed's own eager code inside its own streams."""
    overrides = [*task, "algo.backend=torch", "total_steps=4096", "eval.every_steps=2048", "eval.episodes=2",
                 "logging.progress_bar=false", "logging.tensorboard=false"]
    train_batch(compose_config([*overrides, "seeds=[0,1]"]), [tmp_path / "population" / f"seed{s}" for s in (0, 1)])
    for seed in (0, 1):
        train(compose_config([*overrides, f"seed={seed}"]), tmp_path / "alone" / f"seed{seed}")
        assert_identical_logs(tmp_path / "alone" / f"seed{seed}", tmp_path / "population" / f"seed{seed}")


def test_a_single_run_on_the_population_engine_draws_from_the_processs_streams_and_swaps_none(tmp_path,
                                                                                             monkeypatch):
    """A single run draws as a plain script does, on either engine: its acting noise, its minibatch permutations and
    any global draw of its code come from the process's streams, which its checkpoint records; nothing is swapped
    in and out around its code (each seed of a population swaps its own)."""
    from benchmarks.engine.batch_trainer import ProcessStreams, RandomState

    def swap(self):
        raise AssertionError("a single run swapped its streams in")

    monkeypatch.setattr(RandomState, "__enter__", swap)
    train(compose_config(["env=CartPole", "algo=ppo", "algo.backend=compiled", "total_steps=1024",
                          "eval.every_steps=1024", *SMALL_UPDATE, *QUIET]), tmp_path)
    recorded, process = read_checkpoint(tmp_path / "checkpoint.pt")["rng"], rng_states()
    assert recorded["python"] == process["python"]
    assert torch.equal(recorded["numpy"][1], process["numpy"][1]) and recorded["numpy"][2:] == process["numpy"][2:]
    assert torch.equal(recorded["torch"], process["torch"])
    assert ProcessStreams.torch is torch.default_generator  # acting and shuffling draw from the process's stream


def test_each_seeds_numpy_stream_swapped_through_its_words_draws_what_get_state_and_set_state_give(monkeypatch):
    """RandomState swaps numpy's global stream by copying MT19937's words where it can (NumpyStream): the same draws,
    process and seeds, and the same recorded states as swapping through get_state and set_state every time, over
    blocks that draw nothing, draw uniforms, draw an odd number of normals (a gaussian left cached, on the seed's
    side or the process's) or reseed; and blocks that draw nothing, with no gaussian cached, read no state (but the
    process's once, as it drew since the last swap)."""
    import numpy as np

    from benchmarks.engine.batch_trainer import NUMPY_STREAM, NumpyStream, RandomState

    def draws(fast: bool) -> tuple[list, int]:
        monkeypatch.setattr(NumpyStream, "fast", fast)
        monkeypatch.setattr(NUMPY_STREAM, "known", None)
        np.random.seed(0)
        seeds, drawn, script = [], [], np.random.default_rng(1)
        for _ in range(3):
            np.random.random(int(script.integers(1, 5)))
            seeds.append(RandomState())
        for block in range(400):
            kind = script.choice(["nothing"] * 6 + ["uniform", "normals", "reseed"])
            with seeds[int(script.integers(3))]:
                if kind == "uniform":
                    drawn.append(np.random.random(int(script.integers(1, 700))))
                elif kind == "normals":
                    drawn.append(np.random.standard_normal(int(script.integers(1, 4))))
                elif kind == "reseed":
                    np.random.seed(int(script.integers(100)))
            if block % 50 == 7:  # the process's own code draws between blocks, once leaving a gaussian cached
                drawn.append(np.random.standard_normal(1 if block == 57 else 2))
        for streams in [*seeds, contextlib.nullcontext()]:  # every cached gaussian drawn (the process's last)
            with streams:
                drawn.append(np.random.standard_normal(np.random.get_state()[3]))
        get_state, reads = np.random.get_state, 0

        def counted():
            nonlocal reads
            reads += 1
            return get_state()

        monkeypatch.setattr(np.random, "get_state", counted)
        for block in range(60):
            with seeds[block % 3]:
                pass
        monkeypatch.undo()
        states = [NumpyStream.as_tuple(seed.numpy) for seed in seeds] + [np.random.get_state()]
        return [np.concatenate(drawn).tobytes()] + [(state[1].tobytes(), *state[2:]) for state in states], reads

    saved = np.random.get_state()
    try:
        (fast, fast_reads), (slow, slow_reads) = draws(True), draws(False)
        # a state as checkpoints record it: np.random.get_state's tuple, types included
        for got, expected in zip(NumpyStream.as_tuple(NumpyStream.from_tuple(saved)), saved):
            assert type(got) is type(expected) and np.array_equal(got, expected)
        assert NumpyStream.as_tuple(NumpyStream.from_tuple(saved))[1].dtype == saved[1].dtype
    finally:
        np.random.set_state(saved)
    assert fast == slow
    assert (fast_reads, slow_reads) == (1, 120)


def poison_seed0_at_iteration_3(backend: str, monkeypatch) -> None:
    """After the update of iteration 3, a NaN in seed 0's policy: the population's check stops that seed."""
    from algorithms.population import EagerPopulation, PopulationBatch

    population_class = PopulationBatch if backend == "compiled" else EagerPopulation
    update = population_class.update

    def update_then_poison_seed0(self, rollouts, iteration, active):
        stats = update(self, rollouts, iteration, active)
        if iteration == 3:
            with torch.no_grad():
                self.algorithms[0].policy.actor.layers[0].weight[0, 0] = float("nan")
        return stats

    monkeypatch.setattr(population_class, "update", update_then_poison_seed0)


@pytest.mark.parametrize("backend", ["compiled", "torch"])
@pytest.mark.slow
def test_a_seed_whose_numbers_go_non_finite_stops_alone_and_the_others_go_on(backend, tmp_path, monkeypatch):
    poison_seed0_at_iteration_3(backend, monkeypatch)
    overrides = ["env=CartPole", "algo=ppo", f"algo.backend={backend}", "total_steps=4096", "eval.every_steps=2048",
                 "eval.episodes=2", *SMALL_UPDATE, "logging.progress_bar=false", "logging.tensorboard=false"]
    summaries = train_batch(compose_config([*overrides, "seeds=[0,1]"]), [tmp_path / f"seed{s}" for s in (0, 1)])
    failed = json.loads((tmp_path / "seed0" / "summary.json").read_text())
    assert failed["status"] == "failed"
    assert "non-finite parameter actor.layers.0.weight at iteration 3 (1536 env steps)" in failed["error"]
    assert [(s["seed"], s["status"], s["env_steps"]) for s in summaries] == [(1, "complete", 4096)]
    if backend == "torch":  # each seed's own code: seed 1 logs what it logs alone
        monkeypatch.undo()
        train(compose_config([*overrides, "seed=1"]), tmp_path / "alone")
        assert_identical_logs(tmp_path / "alone", tmp_path / "seed1")


@pytest.mark.parametrize("backend", ["compiled", "torch"])
@pytest.mark.slow
def test_a_population_paused_after_one_seed_stopped_resumes_the_others_to_the_uninterrupted_numbers(
        backend, tmp_path, monkeypatch, capsys):
    """Seed 0 stops on non-finite numbers at iteration 3, seed 1 pauses at iteration 4 (its checkpoints: 3 and 4,
    seed 0's newest: 2). The rerun resumes seed 1 from its own checkpoint with seed 0 inactive beside it, as the
    uninterrupted population carried it, and leaves seed 0's logs and summary as they were (the rerun was refused:
    'no checkpoint at iteration 2', and wrote 'failed' over every seed's summary)."""
    poison_seed0_at_iteration_3(backend, monkeypatch)
    overrides = ["env=CartPole", "algo=ppo", f"algo.backend={backend}", "total_steps=4096", "eval.every_steps=1024",
                 "eval.episodes=2", *SMALL_UPDATE, "logging.progress_bar=false", "logging.tensorboard=false",
                 "logging.checkpoint_every_steps=512", "seeds=[0,1]"]
    train_batch(compose_config(overrides), [tmp_path / "reference" / f"seed{s}" for s in (0, 1)])
    runs = [tmp_path / "paused" / f"seed{s}" for s in (0, 1)]
    paused = train_batch(compose_config([*overrides, "pause_at_steps=2048"]), runs)
    assert [(s["seed"], s["status"], s["env_steps"]) for s in paused] == [(1, "paused", 2048)]
    stopped_summary = (runs[0] / "summary.json").read_bytes()
    capsys.readouterr()
    resumed = train_batch(compose_config(overrides), runs)
    assert [(s["seed"], s["status"], s["env_steps"]) for s in resumed] == [(1, "complete", 4096)]
    assert (f"stopped, not resumed: {runs[0]} (non-finite parameter actor.layers.0.weight at iteration 3 (1536 env "
            f"steps); the last good checkpoint is kept)\n") in capsys.readouterr().err
    assert (runs[0] / "summary.json").read_bytes() == stopped_summary
    for seed, run in zip((0, 1), runs):
        assert_identical_logs(tmp_path / "reference" / f"seed{seed}", run)


def test_a_rerun_of_a_population_whose_unfinished_seeds_all_stopped_trains_nothing_and_says_so(tmp_path):
    """Seed 0's env returns a NaN reward at iteration 2: it stops there, seed 1 completes. A rerun finds seed 1
    complete and seed 0 stopped where a rerun would stop it again: it trains nothing (it trained seed 0 alone
    from its checkpoint, another population, which stopped again: 'every seed of the batch failed', exit 1)."""
    command = [sys.executable, str(ROOT / "run.py"), "env=CartPole", "env.id=tests.tasks:LineNaNRewardInSeed0-v0",
               "algo=ppo", "seeds=[0,1]", "total_steps=2048", "eval.every_steps=1024", *SMALL_UPDATE, *QUIET,
               "logging.checkpoint_every_steps=512", f"hydra.run.dir={tmp_path}/job"]
    first = run_python(command, cwd=ROOT)
    assert first.returncode == 0, first.stderr[-3000:]
    stopped = tmp_path / "job" / "seed0"
    summary = (stopped / "summary.json").read_bytes()
    error = json.loads(summary)["error"]
    assert error.startswith("NonFiniteError: the task's env returned a non-finite reward at iteration 2 ")
    again = run_python(command, cwd=ROOT)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [line for line in again.stderr.splitlines() if not line.startswith("note: ")] == [
        f"already complete, skipped: {tmp_path}/job/seed1 (final eval return "
        f"{json.loads((tmp_path / 'job' / 'seed1' / 'summary.json').read_text())['final_eval_return_mean']:.2f})",
        f"stopped, skipped: {stopped} ({error}; restart=true trains it again)"]
    assert (stopped / "summary.json").read_bytes() == summary
    # seed 0 alone (a population of one): the same result, said the same way, and a failed run's exit status
    alone = [argument.replace("seeds=[0,1]", "seed=0").replace("/job", "/alone") for argument in command]
    assert run_python(alone, cwd=ROOT).returncode == 1
    again = run_python(alone, cwd=ROOT)
    assert again.returncode == 1 and again.stderr.splitlines()[-1] == (
        f"stopped, skipped: {tmp_path}/alone ({error}; restart=true trains it again)")  # (it trained to it again)


@pytest.mark.parametrize("env_id, num_envs, min_ends", [("CartPole-v1", 3, 200), ("Pendulum-v1", 1, 15)])
def test_the_compiled_engines_env_layer_and_statistics_step_as_each_seeds_own_wrappers_and_normalisers(
        env_id, num_envs, min_ends):
    """LockstepEnvs and LockstepStatistics (every seed on [seeds, envs] arrays: the compiled engine's) against the
    eager path's PerSeedEnvs (each seed's own Gymnasium wrappers) and each seed's own ObservationNormalizer and
    RewardScaler given the same float64 observations and rewards: the same observations, ends, episode sums,
    scaled rewards and normalised observations, bit for bit, over many episode ends and reset steps, with a seed
    that stops and steps again. (The eager path normalises a float32 task's observations in float32, the compiled
    engine in float64: there the two round differently by design.)"""
    from types import SimpleNamespace

    import gymnasium as gym
    import numpy as np

    from algorithms.core import ObservationNormalizer, RewardScaler
    from benchmarks.engine.batch_trainer import (LockstepEnvs, LockstepStatistics, PerSeedEnvs, PerSeedStatistics,
                                                 RandomState)
    from benchmarks.engine.envs import make_vector_env

    seeds = 3

    def seeds_envs():
        stacks = [make_vector_env(env_id, num_envs, seed=seed) for seed in range(seeds)]
        return stacks, [envs.reset(seed=seed)[0].astype(np.float64) for seed, envs in enumerate(stacks)]

    def seeds_statistics(first_obs):
        runs = [SimpleNamespace(obs_normalizer=ObservationNormalizer(obs.shape[1:], True),
                                reward_scaler=RewardScaler(num_envs, 0.99, True)) for obs in first_obs]
        for run, obs in zip(runs, first_obs):
            run.obs = run.obs_normalizer(obs, update=True).astype(np.float32)
        return runs

    stacks, first_obs = seeds_envs()
    lockstep = LockstepEnvs(stacks, batched_physics=False)
    lockstep_statistics, own_statistics = LockstepStatistics(seeds_statistics(first_obs)), PerSeedStatistics(
        seeds_statistics(first_obs))
    eager = PerSeedEnvs(seeds_envs()[0], [RandomState() for _ in range(seeds)])
    space = stacks[0].single_action_space
    rng = np.random.default_rng(0)
    episode_ended = np.zeros((seeds, num_envs), dtype=bool)
    ends = 0
    for t in range(1500):
        if isinstance(space, gym.spaces.Discrete):
            actions = rng.integers(0, space.n, (seeds, num_envs))
        else:
            actions = rng.normal(0.0, 3.0, (seeds, num_envs) + space.shape).astype(np.float32)  # beyond the bounds
        active = np.array([True, t % 7 != 3, t < 1000])
        on = np.flatnonzero(active)
        valid = ~episode_ended & active[:, None]
        raw_obs, ended = lockstep.step(actions, active)
        expected_raw_obs, expected_ended = eager.step(actions, active)
        assert np.array_equal(ended, expected_ended), t
        assert np.array_equal(raw_obs[on], np.stack([expected_raw_obs[index] for index in on])), t
        for name in ("rewards", "terminated", "truncated"):
            assert np.array_equal(getattr(lockstep, name)[on], np.stack(getattr(eager, name))[on]), (t, name)
        assert np.array_equal(lockstep.episode_returns[ended], eager.episode_returns[ended]), t
        assert np.array_equal(lockstep.episode_lengths[ended], eager.episode_lengths[ended]), t
        episode_ended = lockstep.terminated | lockstep.truncated
        scaled = lockstep_statistics.scale(lockstep.rewards, episode_ended, valid)
        expected_scaled = own_statistics.scale(list(lockstep.rewards), episode_ended, valid)
        assert np.array_equal(scaled[on], expected_scaled[on]), t
        normalized = lockstep_statistics.normalize(raw_obs, active)
        expected_normalized = own_statistics.normalize(list(raw_obs), active)
        assert np.array_equal(normalized[on], expected_normalized[on]), t
        for run, obs in zip(own_statistics.runs, expected_normalized):
            run.obs = obs
        if t % 100 == 99:  # what a checkpoint saves: the vector layers' counters and flags, as the wrappers keep them
            lockstep.to_layers()
            for ours, theirs in zip(lockstep.vector_envs, eager.vector_envs):
                for kind, names in ((gym.wrappers.vector.RecordEpisodeStatistics,
                                     ("episode_count", "episode_returns", "episode_lengths", "prev_dones")),
                                    (gym.vector.SyncVectorEnv, ("_autoreset_envs",))):
                    for name in names:
                        assert np.array_equal(getattr(LockstepEnvs.layer(ours, kind), name),
                                              getattr(LockstepEnvs.layer(theirs, kind), name)), (t, name)
        ends += int(ended.sum())
    assert ends >= min_ends
