"""The population engine (algo.backend=compiled; algorithms/population.py): PPO's torch loss over a seed axis,
autograd for its gradient, torch.compile for speed. Seed i of a population is the run it is alone (a population
of one) up to float rounding, for every preset; a variant that only adds a loss term is vectorized with no code
of its own; what a population cannot run is refused by its text; a killed population resumes exactly."""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from algorithms import ALGORITHMS
from algorithms.core import MLP
from algorithms.ppo import PPO, Batch, Evaluation
from algorithms.ppo_kl import PPOKL
from algorithms.population import LossReadError, PopulationBatch
from benchmarks.engine.batch_trainer import train_batch
from benchmarks.engine.checkpoint import read_checkpoint
from benchmarks.engine.config import compose_config
from benchmarks.engine.trainer import train
from tests.conftest import SMALL_UPDATE
from tests.test_resume import assert_same_metrics, launch, wait_for_rows

PRESETS = ["ppo", "ppo_kl", "outer_ppo", "outer_ppo_lr", "outer_ppo_nesterov", "outer_ppo_biased", "hp3o",
           "hp3o_plus"]


def short_run(env: str, algo: str, iterations: int) -> list[str]:
    return [f"env={env}", f"algo={algo}", *SMALL_UPDATE, "algo.backend=compiled", "env.num_envs=2",
            "env.num_steps=256", f"total_steps={512 * iterations}", "eval.every_steps=100000", "eval.at_start=false",
            "eval.episodes=1", "logging.progress_bar=false", "logging.tensorboard=false"]


@pytest.fixture
def eager(monkeypatch):
    """The population's program run eager: the same numbers as compiled up to rounding, without compile time."""
    monkeypatch.setenv("POPULATION_COMPILE", "0")


@pytest.mark.slow
@pytest.mark.parametrize("env", ["HalfCheetah", "CartPole"])
@pytest.mark.parametrize("algo", PRESETS)
def test_seed_i_of_a_population_of_4_takes_the_update_it_takes_alone(algo, env, eager, tmp_path):
    # The biased start needs a previous outer step: two iterations on CartPole. Not on HalfCheetah: a population's
    # first update differs from a lone seed's by float rounding (batched products), and the chaotic physics
    # grows that into a different second rollout; test_a_population_of_one_takes_the_eager_torch_update checks
    # the biased start there, on the same two rollouts.
    iterations = 2 if algo == "outer_ppo_biased" and env == "CartPole" else 1
    overrides = short_run(env, algo, iterations)
    # One update: float rounding of the batched products, 2e-5. Two: the second update starts from weights that
    # differ by that rounding and Adam's normalised steps can turn it into up to one step of the learning rate
    # on a weight whose gradient is near 0 (4.9e-4 measured on an AVX-512 AMD EPYC, lr 6.9e-4, the same rollouts
    # in both); a bias step taken wrongly or not at all moves weights by bias_coef x the last outer step, 1e-2
    # and more. The second update's statistics likewise, to 1e-2 (approx_kl 0.02766 against 0.02781 measured).
    tolerance = 2e-5 if iterations == 1 else compose_config(overrides).algo.lr
    seeds = [3, 7, 11, 19]
    train_batch(compose_config([*overrides, f"seeds={seeds}"]), [tmp_path / "population" / f"seed{s}" for s in seeds])
    for seed in (3, 19):
        train(compose_config([*overrides, f"seed={seed}"]), tmp_path / f"alone{seed}")  # a population of one
        alone = read_checkpoint(tmp_path / f"alone{seed}" / "checkpoint.pt")["algorithm"]["policy"]
        together = read_checkpoint(tmp_path / "population" / f"seed{seed}" / "checkpoint.pt")["algorithm"]["policy"]
        for name, value in alone.items():
            torch.testing.assert_close(together[name], value, rtol=0, atol=tolerance,
                                       msg=lambda text: f"seed {seed}, {name}: {text}")
        rows = [pd.read_csv(path / "train.csv").iloc[-1]
                for path in (tmp_path / f"alone{seed}", tmp_path / "population" / f"seed{seed}")]
        for column in ("loss", "policy_loss", "value_loss", "entropy", "approx_kl", "grad_norm"):
            if column in rows[0]:
                assert rows[1][column] == pytest.approx(rows[0][column], rel=1e-3 if iterations == 1 else 1e-2,
                                                        abs=1e-5), column
    first, last = (read_checkpoint(tmp_path / "population" / f"seed{s}" / "checkpoint.pt")["algorithm"]["policy"]
                   for s in (3, 19))
    assert all(not torch.equal(first[name], last[name]) for name in first if name.endswith("weight"))


@pytest.mark.parametrize("algo", ["ppo", "outer_ppo", "outer_ppo_lr", "outer_ppo_nesterov", "outer_ppo_biased",
                                  "hp3o", "hp3o_plus", "ppo with plain SGD"])
def test_a_population_of_one_takes_the_eager_torch_update(algo, eager):
    """The vectorized update (padded, masked minibatches; Adam and the norm clip as tensor ops; Outer-PPO's outer
    step around the epochs, by its own begin_update/end_update) against the algorithm's own eager update
    (torch.optim.Adam, clip_grad_norm_) on the same rollouts and permutations; three updates, so that momentum,
    the biased start and HP3O's buffer of finished episodes (its hybrid batches, of varying sizes) act."""
    import copy

    from benchmarks.engine.batch_trainer import RandomState
    from tests.test_outer_ppo import synthetic_rollout

    torch.manual_seed(0)
    preset = algo.split()[0]  # "ppo with plain SGD": the population's SGD step (Outer-PPO's named inner optimizer)
    cfg = compose_config([f"algo={preset}", "env=HalfCheetah", "algo.backend=torch", *SMALL_UPDATE])
    kind = cfg.algo.algorithm
    alone = (PPOWithSGD if "SGD" in algo else ALGORITHMS[kind])(17, 6, False, cfg.algo, 10)
    member = copy.deepcopy(alone)
    member.optimizer = member.build_optimizer()
    if kind == "outer_ppo":
        member.outer_params = (member.policy.actor_parameters() if member.cfg.apply_to == "actor" or member.full_batch
                               else list(member.policy.parameters()))
        from algorithms.outer_ppo import optimizer_from_config

        member.outer_optimizer = optimizer_from_config(member.outer_params, member.cfg.outer_optimizer)
        if member.full_batch:  # the named preset: inner SGD on the actor, then the critic's own Adam
            member.critic_optimizer = type(alone.critic_optimizer)(member.policy.critic.parameters(),
                                                                   **alone.critic_optimizer.defaults)
    assert member.population_update == "vectorized"
    rollouts = [synthetic_rollout(alone, 17, num_steps=200, num_envs=2, seed=seed) for seed in (1, 2, 3)]
    for rollout in rollouts:
        rollout.valid[50, 0] = False  # a reset row: dropped, so the seed's minibatches are padded
    torch.manual_seed(5)
    randoms = RandomState()  # the population draws its permutations from this, PPO from the global stream
    population = PopulationBatch([member], [randoms])
    torch.manual_seed(5)
    for iteration, rollout in enumerate(rollouts, start=1):
        expected = alone.update(rollout, iteration)
        got = population.update([rollout], iteration, [True])[0]
        for a, b in zip(alone.policy.parameters(), member.policy.parameters()):
            # relative as well: the named preset's outer step at sigma_eff moves each weight by a share of the
            # update vector's norm, so the two sums' rounding differences grow with the weights' move (1.1e-5 on a
            # weight of 0.14 measured at its 1M values: relative 7.8e-5)
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
        assert list(got) == list(expected)  # train.csv's columns, in its order
        for key, value in expected.items():
            if not (isinstance(value, float) and math.isnan(value)):
                # (a cosine of two nearly orthogonal update vectors carries the weights' relative differences
                # above undivided: 1.2e-5 measured on another CPU)
                tolerance = 1e-4 if key == "outer_grad_cosine" else 1e-6
                assert got[key] == pytest.approx(value, rel=1e-4, abs=tolerance), key
    if kind == "outer_ppo":
        assert got["outer_grad_norm"] > 0 and got["outer_step_norm"] > 0
    if kind == "hp3o":  # the last update trained on hybrid batches from a buffer of finished episodes
        assert got["buffer_fill"] >= 2 and 0 < got["old_policy_fraction"] < 1


@pytest.mark.parametrize("algo", ["ppo", "hp3o", "outer_ppo_lr"])  # HP3O: each epoch's hybrid batch is drawn as the
# epoch starts; Outer-PPO: PPO's epochs between its own steps
def test_each_seed_of_a_population_ends_its_epochs_at_target_kl_as_it_does_alone(algo, eager):
    """PPO's target-KL stop (PPO.run_epochs) is each seed's own in a population: two seeds whose first epoch ends
    at different approx KLs (seed 2 steps at 10 x the lr), the target between them, so that one stops after its
    first epoch and the other trains on; each takes the three updates it takes alone (its steps, its draws, its
    statistics). Seed 1's episodes end later in its rollouts, so that HP3O's seed 1 draws larger hybrid batches:
    the seed that stops has fewer minibatches in its epoch than the other, whose last one is not its own."""
    import copy
    import random

    import numpy as np

    from benchmarks.engine.batch_trainer import RandomState
    from tests.test_outer_ppo import synthetic_rollout

    def seeded(seed: int) -> None:
        torch.manual_seed(seed), random.seed(seed), np.random.seed(seed)

    def build(seed: int, target_kl) -> PPO:
        overrides = [f"algo={algo}", "env=HalfCheetah", "algo.backend=torch", "algo.update_epochs=4",
                     "algo.num_minibatches=4", f"algo.target_kl={target_kl}"]
        cfg = compose_config(overrides)
        if seed == 2:
            cfg = compose_config([*overrides, f"algo.lr={10 * cfg.algo.lr}"])
        torch.manual_seed(seed)
        return ALGORITHMS[cfg.algo.algorithm](17, 6, False, cfg.algo, 10)

    def rollout(seed: int, index: int):
        made = synthetic_rollout(build(seed, "null"), 17, num_steps=200, num_envs=2, seed=10 * seed + index)
        if seed == 1:  # its episodes end at row 180, not 100
            made.terminated[100], made.terminated[180] = False, True
        return made

    def recorded(algorithm: PPO) -> tuple[list[float], list[int]]:
        """Lists filled as the algorithm's eager updates run: approx_kl of each step, minibatches of each epoch."""
        kls, epochs = [], []
        step, cut = algorithm.minibatch_step, algorithm.epoch_minibatches
        algorithm.minibatch_step = lambda *args: (stats := step(*args), kls.append(float(stats["approx_kl"])))[0]
        algorithm.epoch_minibatches = lambda *args: (pieces := cut(*args), epochs.append(len(pieces)))[0]
        return kls, epochs

    def first_update_steps(algorithm: PPO, stream: int, rollout) -> tuple[list[float], list[int]]:
        kls, epochs = recorded(algorithm)
        seeded(stream)
        algorithm.update(rollout, 1)
        return kls, epochs

    rollouts = {seed: [rollout(seed, i) for i in range(3)] for seed in (1, 2)}
    ends, first_epoch = {}, {}  # each seed's approx KL after its first epoch with no target, and its minibatches
    for seed in (1, 2):
        kls, epochs = first_update_steps(build(seed, "null"), 100 + seed, rollouts[seed][0])
        ends[seed], first_epoch[seed] = kls[epochs[0] - 1], epochs[0]
    low, high = sorted(ends.values())
    assert high > 1.02 * low  # a target between them stands far above float rounding (1e-5)
    target = math.sqrt(low * high)
    stops, goes_on = (seed for seed in sorted(ends, key=ends.get, reverse=True))
    if algo == "hp3o":
        assert first_epoch[stops] < first_epoch[goes_on]
    assert len(first_update_steps(build(stops, target), 100 + stops, rollouts[stops][0])[1]) == 1
    assert len(first_update_steps(build(goes_on, target), 100 + goes_on, rollouts[goes_on][0])[1]) > 1

    alone, members, randoms, expected = {}, [], [], {}
    for seed in (1, 2):
        alone[seed] = build(seed, target)
        member = copy.deepcopy(alone[seed])
        member.optimizer = member.build_optimizer()
        members.append(member)
        seeded(100 + seed)
        randoms.append(RandomState())  # the population's streams of the seed, where its update alone starts
        kls, epochs = recorded(alone[seed])
        seeded(100 + seed)
        expected[seed] = [alone[seed].update(rollout, iteration) for iteration, rollout in
                          enumerate(rollouts[seed], start=1)]
        # every stop decision of the three updates stands clear of float rounding, so that the population's KLs,
        # equal to rounding, decide alike (on another CPU too)
        epoch_ends = [kls[sum(epochs[:e + 1]) - 1] for e in range(len(epochs))]
        assert min(abs(kl / target - 1) for kl in epoch_ends) > 1e-3, (seed, epoch_ends, target)
    population = PopulationBatch(members, randoms)
    got = [population.update([rollouts[1][i], rollouts[2][i]], i + 1, [True, True]) for i in range(3)]
    for index, seed in enumerate((1, 2)):
        for a, b in zip(alone[seed].policy.parameters(), members[index].policy.parameters()):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
        for iteration in range(3):
            stats, want = got[iteration][index], expected[seed][iteration]
            assert list(stats) == list(want)
            for key, value in want.items():
                if not (isinstance(value, float) and math.isnan(value)):
                    assert stats[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (seed, iteration, key)


@pytest.mark.parametrize("max_norm", [0.1, 100.0])  # the clip binds; it does not
def test_the_populations_norm_clip_scales_the_gradient_as_clip_grad_norm_does(max_norm):
    """The update's clip on a flat gradient against torch's on the parameters' own (the population-of-one test above
    cannot see its epsilon: one clipped step's difference is far below that test's tolerance)."""
    from algorithms.population import clip_by_global_norm

    torch.manual_seed(0)
    grads = [0.05 * torch.randn(5, 3), 0.05 * torch.randn(7)]  # norm about 0.23
    params = [torch.zeros_like(grad, requires_grad=True) for grad in grads]
    for param, grad in zip(params, grads):
        param.grad = grad.clone()
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    clipped, flat_norm = clip_by_global_norm(torch.cat([grad.reshape(-1) for grad in grads]), max_norm)
    torch.testing.assert_close(flat_norm, norm, rtol=1e-6, atol=0)
    torch.testing.assert_close(clipped, torch.cat([param.grad.reshape(-1) for param in params]), rtol=1e-6, atol=0)
    assert (float(clipped.norm()) < 0.11) == (max_norm == 0.1)


class PPOWithActionPenalty(PPO):
    """A variant a researcher might bring: PPO plus a penalty on the squared mean action. Nothing but the term."""

    def loss_terms(self, new: Evaluation, minibatch: Batch, stats: dict) -> dict[str, torch.Tensor]:
        terms = super().loss_terms(new, minibatch, stats)
        head = self.policy.actor(minibatch["obs"])
        from algorithms.core import masked_mean

        penalty = masked_mean(head.pow(2).sum(-1), minibatch.get("mask"))
        stats["action_penalty"] = penalty.detach()
        terms["action_penalty"] = 0.1 * penalty
        return terms


def test_a_variant_that_adds_a_loss_term_trains_vectorized_and_compiled(monkeypatch, compiled, tmp_path):
    monkeypatch.setitem(ALGORITHMS, "ppo", PPOWithActionPenalty)
    overrides = short_run("Pendulum", "ppo", 2)
    train_batch(compose_config([*overrides, "seeds=[0,1]"]), [tmp_path / f"seed{s}" for s in (0, 1)])
    for seed in (0, 1):
        log = pd.read_csv(tmp_path / f"seed{seed}" / "train.csv")
        assert len(log) == 2 and (log["action_penalty"] > 0).all()
    summary = read_checkpoint(tmp_path / "seed0" / "checkpoint.pt")
    assert summary["config"]["algo"]["backend"] == "compiled"

    built = []
    original = PopulationBatch.__init__

    def record(self, *args, **kwargs):
        original(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(PopulationBatch, "__init__", record)
    train_batch(compose_config([*short_run("Pendulum", "ppo", 1), "seeds=[0,1]"]), [tmp_path / f"again{s}" for s in (0, 1)])
    assert built[0].vectorized and built[0].steps[0].mode == "compiled"  # the fast path, with no code of its own


@pytest.mark.slow
def test_a_variant_of_a_module_of_ones_own_is_named_on_the_command_line_and_trains_as_a_population(tmp_path, capsys):
    """algo.algorithm=module:Class: this file's variant, named on run.py's command line (no registry entry), under a
    name of its own, defaults to the population engine and trains vectorized as a population; each seed's summary
    names the class, and `benchmarks.reproduce` reruns it (no preset of that name: PPO's defaults under its config)."""
    from benchmarks.reproduce import main as reproduce

    variant = "tests.test_population:PPOWithActionPenalty"
    overrides = [item for item in short_run("Pendulum", "ppo", 1) if not item.startswith("algo.backend=")]
    process = launch([*overrides, "algo.name=ppo_action_penalty", f"algo.algorithm={variant}", "seeds=[0,1]"], tmp_path)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    for seed in (0, 1):
        assert (pd.read_csv(tmp_path / f"seed{seed}" / "train.csv")["action_penalty"] > 0).all()
        summary = json.loads((tmp_path / f"seed{seed}" / "summary.json").read_text())
        assert (summary["status"], summary["config"]["algo"]["name"]) == ("complete", "ppo_action_penalty")
        assert (summary["config"]["algo"]["algorithm"], summary["config"]["algo"]["backend"]) == (variant, "compiled")
        assert summary["batched"]["trained_together"] == [0, 1] and summary["batched"]["program"] == "eager"
    # the module's file and hash are recorded beside the commit; reproduce notes a module changed since
    this_file = str(Path(__file__).resolve())
    this_hash = hashlib.sha256(Path(this_file).read_bytes()).hexdigest()
    assert summary["algorithm_source"] == {"module": "tests.test_population", "file": this_file, "sha256": this_hash}
    summary["algorithm_source"]["sha256"] = "0" * 64
    (tmp_path / "seed1" / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(SystemExit) as exited:
        reproduce([str(tmp_path / "seed1")])
    printed = capsys.readouterr().out
    assert exited.value.code == 0, printed
    assert (f"  note: its algorithm's module tests.test_population has changed since the run (sha256 000000000000 of "
            f"{this_file} then, {this_hash[:12]} of {this_file} now): a difference below may be the code's"
            in printed.splitlines()), printed
    # where the module cannot be imported (evaluate started elsewhere, without the repository on its path; a run
    # whose module is gone), each command says so in one line
    elsewhere = subprocess.run([sys.executable, "-m", "benchmarks.evaluate", str(tmp_path / "seed1")], cwd=tmp_path,
                               capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
    assert elsewhere.returncode == 2 and elsewhere.stderr.strip().splitlines()[-1].endswith(
        f"checkpoint.pt: algo.algorithm={variant}: its module tests.test_population cannot be imported "
        f"(ModuleNotFoundError: No module named 'tests')"), elsewhere.stderr
    summary["config"]["algo"]["algorithm"] = "nosuchmodule:PPOWithActionPenalty"
    (tmp_path / "seed1" / "summary.json").write_text(json.dumps(summary))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        reproduce([str(tmp_path / "seed1")])
    assert exited.value.code == 1
    assert capsys.readouterr().out.splitlines() == [
        f"{tmp_path / 'seed1'}: not rerun: algo.algorithm=nosuchmodule:PPOWithActionPenalty: its module nosuchmodule "
        f"cannot be imported (ModuleNotFoundError: No module named 'nosuchmodule') (its module must be importable, as "
        f"where the run was made)",
        "0 of 1 runs reproduce every logged number (1 could not be rerun here, said above)"]


class PPOWithUnmaskedPenalty(PPOWithActionPenalty):
    """The same penalty with its mean taken over every row, padding included: a population would train on its
    padded rows, where the eager path (no padding) would not."""

    def loss_terms(self, new: Evaluation, minibatch: Batch, stats: dict) -> dict[str, torch.Tensor]:
        terms = PPO.loss_terms(self, new, minibatch, stats)
        terms["action_penalty"] = 0.1 * self.policy.actor(minibatch["obs"]).pow(2).sum(-1).mean()
        return terms


class PPOWithNoisyValues(PPO):
    """A term that draws noise inside the loss (from torch's global stream)."""

    def loss_terms(self, new: Evaluation, minibatch: Batch, stats: dict) -> dict[str, torch.Tensor]:
        from algorithms.core import masked_mean

        terms = super().loss_terms(new, minibatch, stats)
        terms["noise"] = 0.01 * masked_mean(torch.randn_like(new.values) * new.values, minibatch.get("mask"))
        return terms


class PPOWithNumpyNoise(PPO):
    """A term scaled by a draw from numpy's global stream (fixed at the draw the trace made, compiled)."""

    def loss_terms(self, new: Evaluation, minibatch: Batch, stats: dict) -> dict[str, torch.Tensor]:
        import numpy as np

        from algorithms.core import masked_mean

        terms = super().loss_terms(new, minibatch, stats)
        terms["noise"] = 0.01 * float(np.random.standard_normal()) * masked_mean(new.values, minibatch.get("mask"))
        return terms


class PPOWithAnnealedEntropy(PPO):
    """Counts its loss evaluations to anneal the entropy bonus: state a compiled loss would write only once."""

    calls = 0

    def entropy_term(self, new: Evaluation, minibatch: Batch, stats: dict) -> torch.Tensor:
        self.calls += 1
        return super().entropy_term(new, minibatch, stats) / self.calls


class PPOWithRowwisePenalty(PPOWithActionPenalty):
    """The penalty left per row: no mean taken."""

    def loss_terms(self, new: Evaluation, minibatch: Batch, stats: dict) -> dict[str, torch.Tensor]:
        terms = PPO.loss_terms(self, new, minibatch, stats)
        terms["action_penalty"] = 0.1 * self.policy.actor(minibatch["obs"]).pow(2).sum(-1)
        return terms


class PPOReadingRawRewards(PPO):
    """Names a loss key that the batch does not carry."""

    loss_keys = PPO.loss_keys + ("raw_rewards",)


class ScaledInputMLP(MLP):
    """An MLP whose input is scaled by a fixed random vector: a buffer (a tensor of the module, not trained)."""

    def __init__(self, in_dim: int, *args):
        super().__init__(in_dim, *args)
        self.register_buffer("scale", 1.0 + torch.rand(in_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x * self.scale)


class PPOWithScaledInputs(PPO):
    """A variant a researcher might bring: each network's input scaled by a fixed random vector, drawn for each seed
    when its algorithm is built (in the seed's own stream)."""

    def __init__(self, obs_dim, action_dim, discrete, cfg, num_iterations, network=None):
        super().__init__(obs_dim, action_dim, discrete, cfg, num_iterations, network)
        hidden = tuple(self.cfg.hidden_sizes)
        self.policy.actor = ScaledInputMLP(obs_dim, hidden, action_dim, 0.01)
        self.policy.critic = ScaledInputMLP(obs_dim, hidden, 1, 1.0)
        self.optimizer = self.build_optimizer()


class CountingMLP(MLP):
    """Counts its forward calls in a buffer, as BatchNorm's running statistics are kept."""

    def __init__(self, *args):
        super().__init__(*args)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return super().forward(x)


class PPOWithItsOwnActor(PPO):
    """PPO whose actor network is the class's actor_class: a researcher's own network."""

    actor_class = MLP

    def __init__(self, obs_dim, action_dim, discrete, cfg, num_iterations, network=None):
        super().__init__(obs_dim, action_dim, discrete, cfg, num_iterations, network)
        self.policy.actor = self.actor_class(obs_dim, tuple(self.cfg.hidden_sizes), action_dim, 0.01)
        self.optimizer = self.build_optimizer()


class PPOCountingForwards(PPOWithItsOwnActor):
    actor_class = CountingMLP


class AttributeCountingMLP(MLP):
    """Counts its forward calls in a plain attribute."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls = getattr(self, "calls", 0) + 1
        return super().forward(x)


class PPOCountingForwardsInAnAttribute(PPOWithItsOwnActor):
    actor_class = AttributeCountingMLP


class NoisyMLP(MLP):
    """Adds noise of its own to its output, drawn from torch's global stream."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        return out + 0.01 * torch.randn_like(out)


class PPOWithANoisyForward(PPOWithItsOwnActor):
    actor_class = NoisyMLP


class PPOShrinkingItsScaleInTheLoss(PPOWithScaledInputs):
    """Writes a buffer of its policy inside the loss."""

    def entropy_term(self, new: Evaluation, minibatch: Batch, stats: dict) -> torch.Tensor:
        with torch.no_grad():
            self.policy.actor.scale.mul_(0.999)
        return super().entropy_term(new, minibatch, stats)


class PPOScalingItsBonusByAPythonNumber(PPO):
    """Turns a tensor into a Python number in its loss (.item()): fine alone, not over a seed axis."""

    def entropy_term(self, new: Evaluation, minibatch: Batch, stats: dict) -> torch.Tensor:
        term = super().entropy_term(new, minibatch, stats)
        return term * (2.0 if stats["entropy"].item() < 0 else 1.0)


class PPOBranchingOnItsValueLoss(PPO):
    """Branches in Python on a tensor's value in its loss."""

    def value_term(self, new: Evaluation, minibatch: Batch, stats: dict) -> torch.Tensor:
        term = super().value_term(new, minibatch, stats)
        return term * 0.5 if term > 100 else term


class PPOKeepingThePositiveAdvantages(PPO):
    """Indexes with a boolean mask in its loss: a shape its values decide."""

    def policy_term(self, new: Evaluation, minibatch: Batch, stats: dict) -> torch.Tensor:
        term = super().policy_term(new, minibatch, stats)
        return term - 0.0 * new.advantages[new.advantages > 0].sum()


class PPOKLBranchingOnItsBeta(PPOKL):
    """Branches in Python on a loss input (PPO-KL's beta, each seed's own tensor in a population)."""

    def loss_terms(self, new: Evaluation, minibatch: Batch, stats: dict) -> dict[str, torch.Tensor]:
        terms = super().loss_terms(new, minibatch, stats)
        if self.kl_beta > 10:
            terms["kl_penalty"] = terms["kl_penalty"] * 0.5
        return terms


def cannot_run_over_seeds(variant: str, refusal: str) -> str:
    return (f"{variant}.loss_terms cannot run over a seed axis, as a population runs it ({refusal}): over that axis a "
            f"value is one per seed, so the loss may not read one in Python (.item(), .tolist(), an `if` on a tensor or "
            f"on a loss input) nor give a tensor a shape its values decide (boolean-mask indexing, nonzero); write it "
            f"with tensor ops (torch.where, torch.clamp, masked_mean), or declare population_update = \"per_seed\" in "
            f"the class")


ITEM_OR_BRANCH = ("vmap: It looks like you're either (1) calling .item() on a Tensor or (2) attempting to use a Tensor "
                  "in some data-dependent control flow or (3) encountering this error in PyTorch internals")


@pytest.mark.parametrize("variant, message", [
    (PPOReadingRawRewards, "PPOReadingRawRewards.loss_keys names 'raw_rewards', which its flatten_rollout does not "
                           "give (it gives 'obs', 'actions', 'log_probs', 'values', 'advantages', 'returns'): add the "
                           "key to the batch flatten_rollout returns"),
    (PPOWithRowwisePenalty, "PPOWithRowwisePenalty.loss_terms: term 'action_penalty' has shape (8,): each term is one "
                            "number, summed into the loss (a mean over the minibatch's rows: masked_mean(x, "
                            "minibatch.get(\"mask\")))"),
    (PPOWithAnnealedEntropy, "PPOWithAnnealedEntropy.loss_terms writes self.calls: a population's compiled loss is "
                             "traced once, so what the loss writes into the algorithm is not repeated at each step; "
                             "keep such state out of the loss (after_epochs, end_update) and give the loss a per-seed "
                             "number through loss_inputs, or declare population_update = \"per_seed\" in the class"),
    (PPOWithUnmaskedPenalty, "PPOWithUnmaskedPenalty.loss_terms: term 'action_penalty' change(s) when its minibatch is "
                             "padded with masked rows, as a population pads every seed's minibatches to one shape: "
                             "take every mean over rows with masked_mean(x, minibatch.get(\"mask\")) "
                             "(algorithms/core.py)"),
    (PPOWithNoisyValues, "PPOWithNoisyValues.loss_terms draws random numbers (from torch's, numpy's or Python's "
                         "global stream): a population's compiled loss draws none; draw them outside the loss, or "
                         "declare population_update = \"per_seed\" in the class (its own update, seed by seed, in "
                         "each seed's own streams)"),
    (PPOWithNumpyNoise, "PPOWithNumpyNoise.loss_terms draws random numbers (from torch's, numpy's or Python's "
                        "global stream): a population's compiled loss draws none; draw them outside the loss, or "
                        "declare population_update = \"per_seed\" in the class (its own update, seed by seed, in "
                        "each seed's own streams)"),
    (PPOScalingItsBonusByAPythonNumber, cannot_run_over_seeds("PPOScalingItsBonusByAPythonNumber", ITEM_OR_BRANCH)),
    (PPOBranchingOnItsValueLoss, cannot_run_over_seeds("PPOBranchingOnItsValueLoss", ITEM_OR_BRANCH)),
    (PPOKLBranchingOnItsBeta, cannot_run_over_seeds("PPOKLBranchingOnItsBeta", ITEM_OR_BRANCH)),
    (PPOKeepingThePositiveAdvantages, cannot_run_over_seeds(
        "PPOKeepingThePositiveAdvantages", "vmap: We do not support batching operators that can support dynamic shape")),
])
def test_a_loss_a_population_would_train_differently_is_refused_in_one_line(variant, message, monkeypatch):
    """A loss key the batch lacks, a term left per row, a loss that counts its calls in the algorithm object, a
    mean taken with x.mean() instead of masked_mean (a population would average over its padding), a term that
    draws random numbers, or one that cannot run over a seed axis (.item(), an `if` on a tensor or on a loss input,
    boolean-mask indexing: the run failed at its first update, in vmap's words): refused at config time, naming
    what; the check leaves the global streams as they were.
    The same penalty with masked_mean, the eager backend, and every shipped preset pass (tests/test_validation.py
    validates every shipped config)."""
    from benchmarks.engine.validate import ConfigError, validate_config

    import random

    import numpy as np

    preset = "ppo_kl" if issubclass(variant, PPOKL) else "ppo"  # its keys: PPO-KL's variant needs PPO-KL's preset
    shipped = ALGORITHMS[preset]
    monkeypatch.setitem(ALGORITHMS, preset, variant)
    cfg = compose_config([*short_run("Pendulum", preset, 1), "seeds=[0,1]"])
    torch.manual_seed(7)
    np.random.seed(7)
    np.random.standard_normal(3)  # a stream already drawn from: a later draw moves its position, not its key
    numpy_state, python_state = np.random.get_state(), random.getstate()
    with pytest.raises(ConfigError) as error:
        validate_config(cfg)
    assert str(error.value) == f"algo.backend=compiled: {message}"
    assert np.random.get_state()[2] == numpy_state[2] and random.getstate() == python_state
    drawn = torch.rand(3)
    torch.manual_seed(7)
    shipped(3, 2, False, cfg.algo, 1)  # what validation itself draws: one small instance of the algorithm
    assert torch.equal(torch.rand(3), drawn)
    validate_config(compose_config([*short_run("Pendulum", preset, 1), "seeds=[0,1]", "algo.backend=torch"]))
    monkeypatch.setitem(ALGORITHMS, preset, PPOWithActionPenalty if preset == "ppo" else shipped)
    validate_config(cfg)


@pytest.mark.parametrize("variant, message", [
    (PPOCountingForwards, "PPOCountingForwards's policy writes actor.calls in its forward: a population acts for "
                          "every seed in one program, which writes nothing of the policy; keep such state in a "
                          "buffer (register_buffer) updated outside the forward (in begin_update, say), or train "
                          "with algo.backend=torch (each seed's own code)"),
    (PPOCountingForwardsInAnAttribute, "PPOCountingForwardsInAnAttribute's policy writes actor.calls in its "
                                       "forward: a population acts for every seed in one program, which writes "
                                       "nothing of the policy; keep such state in a buffer (register_buffer) "
                                       "updated outside the forward (in begin_update, say), or train with "
                                       "algo.backend=torch (each seed's own code)"),
    (PPOWithANoisyForward, "PPOWithANoisyForward's policy draws random numbers in its forward (from torch's, "
                           "numpy's or Python's global stream): a population's act program draws none, it gives the "
                           "forward each seed's draws from the seed's own generator; train with algo.backend=torch "
                           "(each seed's own code)"),
    (PPOShrinkingItsScaleInTheLoss, "PPOShrinkingItsScaleInTheLoss.loss_terms writes self.policy.actor.scale: a "
                                    "population's compiled loss is traced once, so what the loss writes into the "
                                    "algorithm is not repeated at each step; keep such state out of the loss "
                                    "(after_epochs, end_update) and give the loss a per-seed number through "
                                    "loss_inputs, or declare population_update = \"per_seed\" in the class"),
])
def test_a_policy_forward_a_population_would_not_repeat_is_refused_in_one_line(variant, message, monkeypatch):
    """A population's programs read each seed's buffers and never write them, and give the forward its draws: a
    forward or a loss that writes a buffer, or a forward that draws from a global stream, is refused at config time,
    naming it; the eager backend (each seed's own code) runs it."""
    from benchmarks.engine.validate import ConfigError, validate_config

    monkeypatch.setitem(ALGORITHMS, "ppo", variant)
    with pytest.raises(ConfigError) as error:
        validate_config(compose_config([*short_run("Pendulum", "ppo", 1), "seeds=[0,1]"]))
    assert str(error.value) == f"algo.backend=compiled: {message}"
    validate_config(compose_config([*short_run("Pendulum", "ppo", 1), "seeds=[0,1]", "algo.backend=torch"]))
    monkeypatch.setitem(ALGORITHMS, "ppo", PPOWithScaledInputs)  # buffers it only reads
    validate_config(compose_config([*short_run("Pendulum", "ppo", 1), "seeds=[0,1]"]))


class PPOWithASequentialActor(PPO):
    """Its actor is any module: here torch's nn.Sequential, without the layers list of PPO's MLP."""

    def __init__(self, obs_dim, action_dim, discrete, cfg, num_iterations, network=None):
        super().__init__(obs_dim, action_dim, discrete, cfg, num_iterations, network)
        self.policy.actor = torch.nn.Sequential(torch.nn.Linear(obs_dim, 32), torch.nn.Tanh(),
                                                torch.nn.Linear(32, action_dim))
        self.optimizer = self.build_optimizer()


def test_an_actor_of_any_module_passes_validation_and_trains_in_a_population(eager, monkeypatch, tmp_path):
    # the act program's draws are as wide as the actor's output, whatever module gives it
    from benchmarks.engine.validate import validate_config

    monkeypatch.setitem(ALGORITHMS, "ppo", PPOWithASequentialActor)
    cfg = compose_config([*short_run("Pendulum", "ppo", 1), "seeds=[0,1]"])
    validate_config(cfg)
    train_batch(cfg, [tmp_path / f"seed{s}" for s in (0, 1)])
    assert all(len(pd.read_csv(tmp_path / f"seed{s}" / "train.csv")) == 1 for s in (0, 1))


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_each_seed_of_a_population_acts_and_learns_with_its_own_buffers(mode, request, monkeypatch, tmp_path):
    # The programs run seed 0's module with each seed's parameters; its buffers (tensors that are not parameters)
    # are each seed's own too: seed 1 of a population logs what it logs alone, where it trained on seed 0's scales.
    import numpy as np

    from algorithms.population import compile_mode

    request.getfixturevalue(mode)
    if compile_mode() != mode:
        pytest.skip("no C++ compiler: programs run eager")

    monkeypatch.setitem(ALGORITHMS, "ppo", PPOWithScaledInputs)
    overrides = short_run("Pendulum", "ppo", 2)
    train_batch(compose_config([*overrides, "seeds=[0,1]"]), [tmp_path / f"seed{s}" for s in (0, 1)])
    train_batch(compose_config([*overrides, "seeds=[1]"]), [tmp_path / "alone"])
    scales = [read_checkpoint(tmp_path / name / "checkpoint.pt")["algorithm"]["policy"]["actor.scale"]
              for name in ("seed0", "seed1", "alone")]
    assert not torch.equal(scales[0], scales[1]) and torch.equal(scales[1], scales[2])
    together, alone = pd.read_csv(tmp_path / "seed1" / "train.csv"), pd.read_csv(tmp_path / "alone" / "train.csv")
    for column in ("policy_loss", "value_loss", "entropy", "approx_kl", "episode_return_mean"):
        np.testing.assert_allclose(together[column], alone[column], rtol=1e-4, atol=1e-6, err_msg=column)


class PPOAnnealingItsEntropyBonus(PPO):
    """A variant a researcher might bring: the entropy bonus annealed once per update, in begin_update (outside the
    loss, as a compiled loss asks), read by the loss from the object - not given through loss_inputs."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.entropy_coef = 0.05

    def begin_update(self, rollout, batch: Batch, iteration: int) -> float:
        self.entropy_coef = 0.05 * (1.0 - (iteration - 1) / self.num_iterations)
        return super().begin_update(rollout, batch, iteration)

    def entropy_term(self, new: Evaluation, minibatch: Batch, stats: dict) -> torch.Tensor:
        from algorithms.core import masked_mean

        entropy_mean = masked_mean(new.entropy, minibatch.get("mask"))
        stats.update(entropy=entropy_mean.detach(), entropy_coef=self.entropy_coef * torch.ones(()))
        return -(self.entropy_coef * entropy_mean)


class PPOGivingItsLossTheAnnealedBonus(PPOAnnealingItsEntropyBonus):
    """The same, the coefficient given to the loss through loss_inputs: each seed's own, at every update."""

    def loss_inputs(self) -> dict[str, float]:
        return {"entropy_coef": self.entropy_coef}


def test_a_value_the_loss_reads_from_the_object_and_the_algorithm_changes_stops_the_population_in_one_line(
        monkeypatch, eager, tmp_path):
    """The population's program runs the loss on a copy of the first seed's object made when it was built: a coefficient
    the algorithm anneals but the loss reads from the object would stay at its first value for every seed, without
    a word. The update that would train on the stale value is refused, naming it; given through loss_inputs, each
    update's value reaches the loss (its statistic logs it)."""
    monkeypatch.setitem(ALGORITHMS, "ppo", PPOAnnealingItsEntropyBonus)
    overrides = [*short_run("Pendulum", "ppo", 3), "seeds=[0,1]"]
    with pytest.raises(LossReadError) as error:
        train_batch(compose_config(overrides), [tmp_path / "stale" / f"seed{s}" for s in (0, 1)])
    assert str(error.value) == (
        f"PPOAnnealingItsEntropyBonus's loss (loss_terms) reads self.entropy_coef, which the population's seed 0 (by "
        f"position) holds as {0.05 * (1 - 1 / 3)!r} where the population's program reads 0.05 (the first seed's "
        f"when the population was built): a number or tensor the loss reads that changes during training or differs "
        f"between seeds goes to the loss through loss_inputs (each seed's own, at every update); for another value, "
        f"declare population_update = \"per_seed\" in the class")
    assert len(pd.read_csv(tmp_path / "stale" / "seed1" / "train.csv")) == 1  # the first update read what it held
    monkeypatch.setitem(ALGORITHMS, "ppo", PPOGivingItsLossTheAnnealedBonus)
    train_batch(compose_config(overrides), [tmp_path / "given" / f"seed{s}" for s in (0, 1)])
    for seed in (0, 1):
        logged = pd.read_csv(tmp_path / "given" / f"seed{seed}" / "train.csv")["entropy_coef"]
        assert logged.tolist() == pytest.approx([0.05, 0.05 * 2 / 3, 0.05 / 3], rel=1e-6)


class PPOWithSGD(PPO):
    """PPO stepped by plain SGD (no momentum): a population steps it with its own SGD."""

    def build_optimizer(self):
        return torch.optim.SGD(self.trained_parameters(), lr=self.cfg.lr)


class PPOWithRMSprop(PPO):
    """Replaces PPO's optimizer but keeps the vectorized update: a population would step Adam instead."""

    def build_optimizer(self):
        return torch.optim.RMSprop(self.trained_parameters(), lr=self.cfg.lr)


def test_an_optimizer_the_population_does_not_step_is_told_apart_without_reading_keys_it_lacks():
    from algorithms.population import steps_optimizer, what_the_step_does_not_compute

    parameters = [torch.nn.Parameter(torch.zeros(3))]
    assert steps_optimizer(torch.optim.Adam(parameters)) and steps_optimizer(torch.optim.SGD(parameters, lr=0.1))
    two_groups = torch.optim.Adam([{"params": parameters}, {"params": [torch.nn.Parameter(torch.zeros(2))]}])
    for other, said in ((torch.optim.Rprop(parameters), ""), (torch.optim.LBFGS(parameters), ""),
                        (torch.optim.AdamW(parameters), ""), (two_groups, " with 2 parameter groups"),
                        (torch.optim.SGD(parameters, lr=0.1, momentum=0.9), " with momentum=0.9"),
                        (torch.optim.SGD(parameters, lr=0.1, maximize=True), " with maximize=True"),
                        (torch.optim.Adam(parameters, maximize=True), " with maximize=True"),
                        (torch.optim.Adam(parameters, amsgrad=True), " with amsgrad=True"),
                        (torch.optim.Adam(parameters, weight_decay=0.1), " with weight_decay=0.1")):
        assert not steps_optimizer(other), type(other).__name__
        assert what_the_step_does_not_compute(other) == said


def test_a_population_refuses_an_optimizer_it_does_not_step(monkeypatch, eager, tmp_path):
    """Refused at config time, in one line; the population itself refuses it too (nothing trains as Adam)."""
    from benchmarks.engine.validate import ConfigError, validate_config

    monkeypatch.setitem(ALGORITHMS, "ppo", PPOWithRMSprop)
    cfg = compose_config([*short_run("Pendulum", "ppo", 1), "seeds=[0,1]"])
    message = ("PPOWithRMSprop builds RMSprop: the population's vectorized update steps Adam or SGD with one "
               "parameter group and no weight decay, momentum, amsgrad or maximize only; declare population_update "
               "= \"per_seed\" in the class")
    with pytest.raises(ConfigError) as error:
        validate_config(cfg)
    assert str(error.value) == f"algo.backend=compiled: {message}"
    with pytest.raises(ValueError) as error:
        train_batch(cfg, [tmp_path / "a", tmp_path / "b"])
    assert str(error.value) == message
    PPOWithRMSprop.population_update = "per_seed"  # declared: its own update, seed by seed
    try:
        validate_config(cfg)
    finally:
        del PPOWithRMSprop.population_update


class PPOWithABonusOfEachSeed(PPOAnnealingItsEntropyBonus):
    """The bonus set per seed (as a variant drawing it per seed would) and never annealed."""

    def begin_update(self, rollout, batch: Batch, iteration: int) -> float:
        return PPO.begin_update(self, rollout, batch, iteration)


def test_a_value_the_loss_reads_that_differs_between_running_seeds_is_refused_at_the_first_update(eager):
    """The program would train every seed on the first seed's value; a stopped seed is not checked."""
    from benchmarks.engine.batch_trainer import RandomState
    from tests.test_outer_ppo import synthetic_rollout

    cfg = compose_config(["algo=ppo", "env=Pendulum", "algo.backend=compiled"])
    members = [PPOWithABonusOfEachSeed(3, 1, False, cfg.algo, 10) for _ in range(2)]
    members[1].entropy_coef = 0.07
    rollouts = [synthetic_rollout(member, 3, seed=index) for index, member in enumerate(members)]
    population = PopulationBatch(members, [RandomState() for _ in members])
    with pytest.raises(LossReadError, match=r"reads self.entropy_coef, which the population's seed 1 \(by position\) "
                                            r"holds as 0.07 where the population's program reads 0.05 "):
        population.update(rollouts, 1, [True, True])
    assert population.update(rollouts, 1, [True, False])[1] is None


class TemperedMLP(MLP):
    """Divides its output by a temperature held as a plain attribute (not a buffer)."""

    temperature = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) / self.temperature


class PPOWithATemperedActor(PPOWithItsOwnActor):
    actor_class = TemperedMLP


class PPOWithATemperatureOfEachSeed(PPOWithATemperedActor):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.policy.actor.temperature = 1.0 + float(torch.rand(()))  # drawn in the seed's own stream


def test_a_population_refused_as_it_is_built_records_the_failure_in_each_seeds_directory(eager, monkeypatch,
                                                                                          tmp_path):
    monkeypatch.setitem(ALGORITHMS, "ppo", PPOWithATemperatureOfEachSeed)
    with pytest.raises(LossReadError) as error:
        train_batch(compose_config([*short_run("Pendulum", "ppo", 1), "seeds=[0,1]"]),
                    [tmp_path / f"seed{s}" for s in (0, 1)])
    for seed in (0, 1):
        summary = json.loads((tmp_path / f"seed{seed}" / "summary.json").read_text())
        assert summary["status"] == "failed" and summary["error"] == f"LossReadError: {error.value}"
        assert "holds actor.temperature as " in summary["error"]


class PPOAnnealingItsTemperature(PPOWithATemperedActor):
    def begin_update(self, rollout, batch: Batch, iteration: int) -> float:
        self.policy.actor.temperature = 1.0 + iteration
        return super().begin_update(rollout, batch, iteration)


def test_a_value_of_the_policy_that_differs_between_seeds_or_changes_is_refused_naming_it(eager):
    """Both programs run seed 0's policy module with each seed's parameters and buffers: a plain attribute its
    forward reads would be seed 0's for every seed, and the one compiled with for the whole run."""
    from benchmarks.engine.batch_trainer import RandomState
    from tests.test_outer_ppo import synthetic_rollout

    cfg = compose_config(["algo=ppo", "env=Pendulum", "algo.backend=compiled"])
    members = [PPOWithATemperedActor(3, 1, False, cfg.algo, 10) for _ in range(2)]
    rollouts = [synthetic_rollout(member, 3, seed=index) for index, member in enumerate(members)]
    members[1].policy.actor.temperature = 2.0
    refused = (r"^PPOWithATemperedActor's policy holds actor.temperature as 2.0 in the population's seed 1 \(by "
               r"position\) where its programs read 1.0 .* goes in a buffer \(register_buffer\)")
    with pytest.raises(LossReadError, match=refused):
        PopulationBatch(members, [RandomState() for _ in members])  # before any rollout acts on it
    members[1].policy.actor.temperature = 1.0
    population = PopulationBatch(members, [RandomState() for _ in members])
    members[1].policy.actor.temperature = 2.0
    assert population.update(rollouts, 1, [True, False])[1] is None  # a stopped seed is not checked
    with pytest.raises(LossReadError, match=refused):
        population.update(rollouts, 2, [True, True])

    annealing = PPOAnnealingItsTemperature(3, 1, False, cfg.algo, 10)
    population = PopulationBatch([annealing], [RandomState()])
    with pytest.raises(LossReadError, match=r"holds actor.temperature as 2.0 in the population's seed 0 "):
        population.update([synthetic_rollout(annealing, 3, seed=0)], 1, [True])


class PPOSettingItsAdam(PPO):
    """Sets its Adam's second-moment decay and weight decay at every update (an annealed beta2, say)."""

    beta2, weight_decay = 0.999, 0.0

    def begin_update(self, rollout, batch: Batch, iteration: int) -> float:
        self.optimizer.param_groups[0].update(betas=(0.9, self.beta2), weight_decay=self.weight_decay)
        return super().begin_update(rollout, batch, iteration)


@pytest.mark.parametrize("setting, held", [("beta2", r"Adam with betas \(0.9, 0.99\) and eps 1e-05"),
                                           ("weight_decay", r"Adam with weight_decay=0.01")])
def test_optimizer_settings_that_differ_between_seeds_are_refused_naming_them(setting, held, eager):
    """The program steps every seed with the first seed's betas and eps as the population was built (only the
    learning rate is each seed's own): another seed's, or a setting the step does not compute, is refused."""
    from benchmarks.engine.batch_trainer import RandomState
    from tests.test_outer_ppo import synthetic_rollout

    cfg = compose_config(["algo=ppo", "env=Pendulum", "algo.backend=compiled"])
    members = [PPOSettingItsAdam(3, 1, False, cfg.algo, 10) for _ in range(2)]
    rollouts = [synthetic_rollout(member, 3, seed=index) for index, member in enumerate(members)]
    population = PopulationBatch(members, [RandomState() for _ in members])
    population.update(rollouts, 1, [True, True])  # the same settings: trained
    setattr(members[1], setting, {"beta2": 0.99, "weight_decay": 0.01}[setting])
    with pytest.raises(LossReadError, match=rf"^the population's seed 1 \(by position\) holds {held} as its optimizer "
                                            rf"where the population's program steps Adam with betas \(0.9, 0.999\) "
                                            rf"and eps 1e-05 \(the first seed's when the population was built\)"):
        population.update(rollouts, 2, [True, True])


class PPOWithALearningRateOfEachSeed(PPO):
    """Each seed steps with its own learning rate, as a schedule adapted per seed (to its update's KL, say) gives."""

    lr_scale = 1.0

    def begin_update(self, rollout, batch: Batch, iteration: int) -> float:
        return self.lr_scale * super().begin_update(rollout, batch, iteration)


def test_each_seed_of_a_population_steps_with_its_own_learning_rate(eager):
    """Two seeds whose schedules differ: each takes the update it takes alone (a population of one) at its own
    rate, and logs it - not one rate for both."""
    import copy

    from benchmarks.engine.batch_trainer import RandomState
    from tests.test_outer_ppo import synthetic_rollout

    torch.manual_seed(0)
    cfg = compose_config(["algo=ppo", "env=Pendulum", "algo.backend=compiled", *SMALL_UPDATE])
    members = [PPOWithALearningRateOfEachSeed(3, 1, False, cfg.algo, 10) for _ in range(2)]
    members[1].lr_scale = 3.0
    alone = [copy.deepcopy(member) for member in members]
    rollouts = [synthetic_rollout(member, 3, num_steps=64, seed=index) for index, member in enumerate(members)]
    torch.manual_seed(5)
    stats = PopulationBatch(members, [RandomState(), RandomState()]).update(rollouts, 1, [True, True])
    assert stats[1]["lr"] == 3 * stats[0]["lr"] == 3 * cfg.algo.lr
    for index in (0, 1):
        torch.manual_seed(5)
        expected = PopulationBatch([alone[index]], [RandomState()]).update([rollouts[index]], 1, [True])[0]
        assert stats[index]["lr"] == expected["lr"]
        for a, b in zip(alone[index].policy.parameters(), members[index].policy.parameters()):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)  # as seed i of 4 against alone; a shared rate
            # would move the first seed's weights by twice its lr per step (~4e-3)


class PPOWithWeightsOfEachAction(PPO):
    """Penalises each action dimension by a weight of the seed's own, drawn when it is built: a tensor the loss reads,
    given through loss_inputs."""

    def __init__(self, obs_dim, action_dim, discrete, cfg, num_iterations, network=None):
        super().__init__(obs_dim, action_dim, discrete, cfg, num_iterations, network)
        self.action_weights = torch.rand(action_dim)

    def loss_inputs(self) -> dict:
        return {"action_weights": self.action_weights}

    def loss_terms(self, new: Evaluation, minibatch: Batch, stats: dict) -> dict[str, torch.Tensor]:
        from algorithms.core import masked_mean

        terms = super().loss_terms(new, minibatch, stats)
        head = self.policy.actor(minibatch["obs"])
        terms["action_penalty"] = masked_mean((head.pow(2) * self.action_weights).sum(-1), minibatch.get("mask"))
        return terms


def test_a_tensor_of_each_seed_the_loss_reads_enters_through_loss_inputs(eager):
    """loss_inputs may give tensors too (here a weight per action dimension): each seed's own, stacked [S, ...], and
    each seed takes the update it takes alone."""
    import copy

    from benchmarks.engine.batch_trainer import RandomState
    from tests.test_outer_ppo import synthetic_rollout

    with torch.random.fork_rng():  # the global stream as it was, for the tests after this one
        torch.manual_seed(0)
        cfg = compose_config(["algo=ppo", "env=Pendulum", "algo.backend=compiled", *SMALL_UPDATE])
        members = [PPOWithWeightsOfEachAction(3, 2, False, cfg.algo, 10) for _ in range(2)]
        members[1].action_weights = torch.tensor([100.0, 0.0])  # a penalty that moves the actor's head a long way
        alone = [copy.deepcopy(member) for member in members]
        rollouts = [synthetic_rollout(member, 3, num_steps=64, seed=index) for index, member in enumerate(members)]
        torch.manual_seed(5)
        PopulationBatch(members, [RandomState(), RandomState()]).update(rollouts, 1, [True, True])
        for index in (0, 1):
            torch.manual_seed(5)
            PopulationBatch([alone[index]], [RandomState()]).update([rollouts[index]], 1, [True])
            for a, b in zip(alone[index].policy.parameters(), members[index].policy.parameters()):
                torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


class PPOForgettingItsLearningRate(PPO):
    """begin_update overridden, its return forgotten."""

    def begin_update(self, rollout, batch: Batch, iteration: int) -> float:
        super().begin_update(rollout, batch, iteration)


def test_a_begin_update_that_returns_no_learning_rate_is_named_on_either_backend(eager):
    """Not a None deep inside an optimizer's step, nor another seed's rate taken in its place."""
    from benchmarks.engine.batch_trainer import RandomState
    from tests.test_outer_ppo import synthetic_rollout

    cfg = compose_config(["algo=ppo", "env=Pendulum", "algo.backend=compiled", *SMALL_UPDATE])
    torch.manual_seed(0)
    members = [PPOForgettingItsLearningRate(3, 1, False, cfg.algo, 10) for _ in range(2)]
    rollout = synthetic_rollout(members[0], 3)
    message = ("PPOForgettingItsLearningRate.begin_update returned None, not the epochs' learning rate (a number): an "
               "override returns it, for instance return super().begin_update(rollout, batch, iteration)")
    with pytest.raises(TypeError) as error:
        members[0].update(rollout, 1)  # the eager backend's update
    assert str(error.value) == message
    with pytest.raises(TypeError) as error:
        PopulationBatch(members, [RandomState(), RandomState()]).update([rollout, rollout], 1, [True, True])
    assert str(error.value) == message


class PPOActingItsOwnWay(PPO):
    """Overrides how a seed acts (a researcher's exploration rule would go here): code a population, which acts for
    its seeds in one program with the policy's own forward, would not run."""

    acted = 0

    def act(self, obs: torch.Tensor):
        PPOActingItsOwnWay.acted += 1
        return super().act(obs)


def test_a_variant_that_overrides_how_a_seed_acts_trains_on_its_own_code_and_no_population_takes_it(monkeypatch,
                                                                                                   tmp_path):
    """Its bare command runs the eager backend, which calls its act; a population is refused at config time in one
    line, and by the population itself (nothing acts as PPO in its place)."""
    from benchmarks.engine.batch_trainer import RandomState
    from benchmarks.engine.validate import ConfigError, validate_config

    monkeypatch.setitem(ALGORITHMS, "ppo", PPOActingItsOwnWay)
    monkeypatch.setattr(PPOActingItsOwnWay, "acted", 0)
    overrides = [*short_run("CartPole", "ppo", 1), "seeds=[0,1]"]
    bare = compose_config([override for override in overrides if override != "algo.backend=compiled"])
    assert bare.algo.backend == "torch"
    train_batch(bare, [tmp_path / f"seed{s}" for s in (0, 1)])
    assert PPOActingItsOwnWay.acted == 2 * 256  # each seed's rollout, through its own act
    message = ("PPOActingItsOwnWay overrides act: a population acts for its seeds in one program, with the policy's "
               "own forward, and would not run that code; train it with algo.backend=torch (each seed's own code; "
               "the default for such a class)")
    with pytest.raises(ConfigError) as error:
        validate_config(compose_config(overrides))
    assert str(error.value) == f"algo.backend=compiled: {message}"
    members = [PPOActingItsOwnWay(4, 2, True, bare.algo, 1) for _ in range(2)]
    with pytest.raises(ValueError) as error:
        PopulationBatch(members, [RandomState() for _ in members])
    assert str(error.value) == message


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ppo_kl", "outer_ppo"])  # outer_ppo: two phases, the critic's own Adam state
def test_a_population_killed_with_sigkill_resumes_to_the_uninterrupted_numbers(algo, compiled, tmp_path):
    overrides = ["env=CartPole", "env_family/values@env=shipped", f"algo={algo}", "algo.backend=compiled",
                 "seeds=[0,1]", "total_steps=4096", "eval.every_steps=1024", "eval.episodes=2",
                 "logging.checkpoint_every_steps=512", "logging.progress_bar=false"]
    reference = launch(overrides, tmp_path / "reference" / "job")  # the same command, uninterrupted
    assert reference.wait(timeout=600) == 0
    victim = launch(overrides, tmp_path / "killed" / "job")
    wait_for_rows(tmp_path / "killed" / "job" / "seed1", 4, victim, timeout=300)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    resumed = launch(overrides, tmp_path / "killed" / "job")
    _, stderr = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, stderr[-3000:]
    assert "resuming" in stderr
    for seed in (0, 1):
        assert_same_metrics(tmp_path / "killed" / "job" / f"seed{seed}", tmp_path / "reference" / "job" / f"seed{seed}")


def test_without_a_cpp_compiler_the_population_runs_eager_and_says_so_in_one_line(monkeypatch, compiled, capsys):
    import shutil

    from algorithms import population

    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert population.compile_mode() == "eager"
    assert capsys.readouterr().err == ("note: no C++ compiler found: the population step runs eager (the same numbers "
                                       "up to rounding, slower)\n")


COMPILE_A_PROGRAM = """
import benchmarks, torch
from algorithms.population import CompiledOnce, compile_mode
program = CompiledOnce(lambda x: torch.sin(x) * 2 + x.sum(), compile_mode())
print(program(torch.arange(12.0).reshape(3, 4)).sum().item())
"""


@pytest.mark.slow
def test_a_damaged_kernel_in_the_compile_cache_is_removed_and_compiled_again(tmp_path):
    """An empty or cut kernel file in inductor's on-disk cache would fail every later run of that program; the engine
    removes it, says so in one line, and compiles it again."""
    from tests.conftest import ROOT

    environment = {**os.environ, "POPULATION_COMPILE": "1", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    first = subprocess.run([sys.executable, "-c", COMPILE_A_PROGRAM], cwd=ROOT, env=environment, capture_output=True,
                           text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    kernels = list((tmp_path / "cache").rglob("*.main.so"))  # the program's kernel (not the cache's ISA probes)
    assert kernels
    for kernel in kernels:
        kernel.write_bytes(b"")  # as one was found
    again = subprocess.run([sys.executable, "-c", COMPILE_A_PROGRAM], cwd=ROOT, env=environment,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout == first.stdout
    assert "note: the compile cache held a damaged kernel (" in again.stderr
    assert all(kernel.stat().st_size > 0 for kernel in kernels)


def test_only_a_damaged_file_inside_the_compile_cache_is_removed(tmp_path, monkeypatch):
    from algorithms.population import remove_damaged_cache_file

    outside = tmp_path / "mine.so"
    outside.write_bytes(b"")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    assert not remove_damaged_cache_file(ImportError(f"{outside}: file too short"))
    assert outside.exists()
    assert not remove_damaged_cache_file(RuntimeError("shape mismatch"))


def test_portable_numerics_pin_the_compiled_programs_vector_width(monkeypatch):
    import torch._inductor.config as inductor

    from algorithms import population

    monkeypatch.setattr(inductor.cpp, "simdlen", None)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    population.pin_code_generator()
    assert inductor.cpp.simdlen == 256


def test_the_vector_isa_probe_runs_once_per_machine_and_a_failed_one_is_never_recorded(monkeypatch, tmp_path):
    import platform

    import torch._inductor.config as inductor
    from torch._inductor import cpu_vec_isa

    from algorithms import population

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("inductor probes vector instruction sets by hand on x86-64 only")
    from torch._inductor.cpp_builder import get_cpp_compiler

    try:
        get_cpp_compiler()
    except RuntimeError:
        pytest.skip("no C++ compiler: nothing is compiled, nothing probed")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    cpu_reports = cpu_vec_isa.x86_isa_checker()
    reported = [isa for isa in cpu_vec_isa.supported_vec_isa_list if all(f in cpu_reports for f in str(isa).split())]
    if not reported:
        pytest.skip("a CPU without AVX2: inductor has no vector instruction set to probe")
    probes = []

    def probe_proving(proved):
        def probe():
            probes.append(proved)
            return proved
        return probe

    # a set the CPU reports failed its probe: nothing is recorded and inductor goes on probing every process
    monkeypatch.setattr(inductor.cpp, "vec_isa_ok", None)
    monkeypatch.setattr(cpu_vec_isa, "valid_vec_isa_list", probe_proving(reported[1:]))
    population.probe_vector_isas_once()
    assert inductor.cpp.vec_isa_ok is None and not list(tmp_path.glob("vector_isas_proved_*"))
    # every set passed: recorded, and a later process (vec_isa_ok unset again) reads the record without probing
    monkeypatch.setattr(cpu_vec_isa, "valid_vec_isa_list", probe_proving(reported))
    population.probe_vector_isas_once()
    assert inductor.cpp.vec_isa_ok is True and len(list(tmp_path.glob("vector_isas_proved_*"))) == 1
    monkeypatch.setattr(inductor.cpp, "vec_isa_ok", None)
    population.probe_vector_isas_once()
    assert inductor.cpp.vec_isa_ok is True and len(probes) == 2
    # another torch (or compiler, or CPU) finds no record of its own: it probes again
    monkeypatch.setattr(torch, "__version__", "0.0.0")
    monkeypatch.setattr(inductor.cpp, "vec_isa_ok", None)
    population.probe_vector_isas_once()
    assert len(probes) == 3 and len(list(tmp_path.glob("vector_isas_proved_*"))) == 2


def test_a_compiled_program_checks_its_guards_on_each_blocks_first_call_and_a_recompile_raises(compiled):
    # What a program reads as a Python number is compiled in as a constant; inside a block the guards that would
    # notice a change are skipped after the first call, and the next block's first call checks them and raises
    # rather than recompiling (a per-seed number that changes belongs in loss_inputs, as a tensor).
    from algorithms.population import CompiledOnce, UncheckedCalls, compile_mode

    if compile_mode() != "compiled":
        pytest.skip("no C++ compiler: programs run eager")
    scale = {"value": 2.0}
    program = CompiledOnce(lambda x: x * scale["value"], "compiled")
    x = torch.ones(3)
    assert program(x).tolist() == [2.0] * 3
    with UncheckedCalls([program]):
        assert program(x).tolist() == [2.0] * 3   # checked: the guards hold
        scale["value"] = 3.0
        assert program(x).tolist() == [2.0] * 3   # unchecked: the constant it was compiled with
    with pytest.raises(Exception, match="[Rr]ecompil"):
        with UncheckedCalls([program]):
            program(x)                            # the block's first call checks, and refuses to recompile
    scale["value"] = 2.0
    with pytest.raises(Exception, match="[Rr]ecompil"):
        program(x * 1)                            # outside a block every call is checked
        program(torch.ones(4))                    # another shape: a recompile


def test_an_eager_program_of_one_seed_calls_the_seeds_function_on_its_row_and_returns_what_vmap_would():
    # vmap's cost per operation buys nothing for one seed: eager, a population of one runs the function itself
    from torch._C._functorch import is_batchedtensor

    from algorithms.population import CompiledOnce

    batched_calls = []

    def one_seed(x, moments):
        batched_calls.append(is_batchedtensor(x))
        return torch.tanh(x) * moments["scale"], {"sum": x.sum(), "norm": torch.linalg.vector_norm(x)}

    program = CompiledOnce(one_seed, "eager")
    generator = torch.Generator().manual_seed(0)
    x, moments = torch.randn(3, 5, generator=generator), {"scale": torch.randn(3, generator=generator)}
    for rows in (slice(0, 1), slice(1, 2)):
        alone = program(x[rows], {"scale": moments["scale"][rows]})
        assert batched_calls.pop() is False
        together = program(x, moments)
        assert batched_calls.pop() is True
        assert alone[0].shape == (1, 5) and alone[1]["sum"].shape == (1,)
        index = rows.start
        assert torch.equal(alone[0][0], together[0][index])
        assert torch.equal(alone[1]["sum"][0], together[1]["sum"][index])
        assert torch.equal(alone[1]["norm"][0], together[1]["norm"][index])


@pytest.mark.parametrize("env, obs_dim, action_dim, discrete", [("HalfCheetah", 17, 6, False), ("CartPole", 4, 2, True)])
@pytest.mark.parametrize("algo", ["ppo", "ppo_kl", "outer_ppo"])
def test_an_eager_step_of_one_seed_differentiates_with_autograd_to_torch_funcs_numbers(
        algo, env, obs_dim, action_dim, discrete, eager, monkeypatch):
    """Eager, one seed (no C++ compiler; the tests' mode), a step differentiates its loss with torch.autograd.grad:
    torch.func.grad's layer around every operation made it 1.6x as long. Bit for bit the gradient and statistics
    torch.func.grad gives, in each phase of the preset (Outer-PPO's full-batch inner loop: two)."""
    from algorithms import build_algorithm
    from algorithms.population import MASK, gradient_and_stats, loss_input_tensors
    from benchmarks.engine.batch_trainer import RandomState

    torch.manual_seed(0)
    algorithm = build_algorithm(algo, obs_dim, action_dim, discrete, compose_config(short_run(env, algo, 1)).algo, 10)
    population = PopulationBatch([algorithm], [RandomState()])
    generator, rows = torch.Generator().manual_seed(1), 64
    actions = (torch.randint(0, action_dim, (rows,), generator=generator).float() if discrete
               else torch.randn(rows, action_dim, generator=generator))
    minibatch = {"obs": torch.randn(rows, obs_dim, generator=generator), "actions": actions,
                 "log_probs": -2 * torch.rand(rows, generator=generator), "values": torch.randn(rows, generator=generator),
                 "advantages": torch.randn(rows, generator=generator), "returns": torch.randn(rows, generator=generator),
                 MASK: torch.ones(rows)}
    inputs = loss_input_tensors(algorithm)
    for step in population.steps:
        def loss(flat):
            named = {f"policy.{name}": value for name, value in step.layout.unflatten(flat).items()}
            return torch.func.functional_call(step.module, named, (minibatch, inputs))

        expected_grad, expected_stats = torch.func.grad(loss, has_aux=True)(population.params[0])
        grad, stats = gradient_and_stats(loss, population.params[0])
        assert grad.abs().sum() > 0 and torch.equal(grad, expected_grad) and stats.keys() == expected_stats.keys()
        assert all(torch.equal(stats[key], expected_stats[key]) and not stats[key].requires_grad for key in stats)
    # a loss that does not read the parameters: a zero gradient, as torch.func.grad gives
    constant = gradient_and_stats(lambda flat: (torch.tensor(1.0), {}), population.params[0])[0]
    assert torch.equal(constant, torch.zeros_like(population.params[0]))

    monkeypatch.setattr(torch.func, "grad", lambda *args, **kwargs: pytest.fail("the eager step of one seed called "
                                                                                "torch.func.grad"))
    step = population.steps[0]
    params, _, stats = step(population.params, population.moments[step.module.phase.optimizer],
                            {key: value.unsqueeze(0) for key, value in minibatch.items()}, [1e-3],
                            torch.ones(1, dtype=torch.bool), {key: value.unsqueeze(0) for key, value in inputs.items()},
                            {})
    assert not torch.equal(params, population.params) and all(torch.isfinite(value).all() for value in stats.values())


@pytest.mark.parametrize("env, obs_dim, action_dim, discrete", [("HalfCheetah", 17, 6, False), ("CartPole", 4, 2, True)])
@pytest.mark.parametrize("algo", ["ppo", "outer_ppo", "outer_ppo_biased", "hp3o"])
def test_an_eager_population_of_one_acts_with_its_module_to_the_programs_numbers(
        algo, env, obs_dim, action_dim, discrete, eager, monkeypatch):
    """Eager, one seed acts with its policy module itself, not through functional_call's swap of the population's
    row 0 into it (which cost more than the forward): so the module must hold row 0 whenever the population acts -
    at the start and after each update, where Outer-PPO's outer step (end_update) and the biased start
    (begin_update) move the parameters outside the step, and HP3O's update trains on its buffer. Bit for bit the
    act program's action, log-prob and value."""
    from algorithms import build_algorithm
    import numpy as np
    from torch.utils import _pytree as pytree

    from benchmarks.engine.batch_trainer import RandomState
    from tests.test_outer_ppo import synthetic_rollout

    torch.manual_seed(0)
    cfg = compose_config([f"env={env}", f"algo={algo}", "algo.backend=compiled", *SMALL_UPDATE])
    algorithm = build_algorithm(cfg.algo.algorithm, obs_dim, action_dim, discrete, cfg.algo, 10)
    population = PopulationBatch([algorithm], [RandomState()])
    generator = torch.Generator().manual_seed(1)
    obs = torch.randn(1, 3, obs_dim, generator=generator)
    draws = torch.rand(1, 3, action_dim, generator=generator) + 0.1  # exponential draws (categorical) are > 0
    real_functional_call = torch.func.functional_call

    def module_outputs_equal_the_programs():
        monkeypatch.setattr(torch.func, "functional_call", lambda *args, **kwargs: pytest.fail(
            "an eager population of one acted through functional_call"))
        with torch.no_grad():
            got = population.policy_outputs(obs, draws)
            values = population.value(obs.numpy())
            population.act(obs.numpy(), np.ones(1, dtype=bool))
        monkeypatch.setattr(torch.func, "functional_call", real_functional_call)
        with torch.no_grad():
            buffers = {name: value[0] for name, value in population.seed_buffers().items()}
            expected = population.acting.one_seed(population.params[0], buffers, obs[0], draws[0])
        expected = pytree.tree_map(lambda tensor: tensor.unsqueeze(0), expected)
        assert all(torch.equal(a, b) for a, b in zip(pytree.tree_leaves(got), pytree.tree_leaves(expected), strict=True))
        assert np.array_equal(values, expected[2].numpy())
        return expected

    before = module_outputs_equal_the_programs()
    for iteration, seed in enumerate((1, 2), start=1):
        population.update([synthetic_rollout(algorithm, obs_dim, num_steps=64, num_envs=2, seed=seed)], iteration,
                          [True])
        after = module_outputs_equal_the_programs()
        assert not torch.equal(after[2], before[2])  # the update moved the critic
        before = after


def test_inside_a_block_a_program_of_its_arguments_alone_calls_its_graph_without_dynamos_frame(compiled):
    # The frame costs more than a small graph; where the graph reads nothing but the call's own tensors, the
    # block's later calls run it directly, with the frame's outputs in the frame's structure. A graph that reads a
    # tensor from elsewhere (an attribute) keeps the frame: it would read that tensor anew on every call.
    from algorithms.population import CompiledOnce, UncheckedCalls, compile_mode

    if compile_mode() != "compiled":
        pytest.skip("no C++ compiler: programs run eager")
    # arguments that are tensors and dicts of tensors (keys not in sorted order), a result of a tensor and a dict
    program = CompiledOnce(lambda x, named: (torch.tanh(x) * named["y"], {"sum": (x * named["y"]).sum(),
                                                                          "max": (x - named["a"]).max()}), "compiled")
    x, named = torch.randn(4, 3), {"y": torch.randn(4, 3), "a": torch.randn(4, 3)}
    expected = program(x, named)
    assert program.direct is not None
    with UncheckedCalls([program]):
        program(x, named)                         # the block's first call: dynamo's frame, its guards checked
        calls = []
        direct = program.direct
        program.direct = lambda arguments: calls.append(arguments) or direct(arguments)
        x, named = torch.randn(4, 3), {"y": torch.randn(4, 3), "a": torch.randn(4, 3)}  # new values, same program
        expected = program.fn(x, named)           # dynamo's frame
        got = program(x, named)
    assert len(calls) == 1
    assert isinstance(got, tuple) and torch.equal(got[0], expected[0]) and list(got[1]) == ["sum", "max"]
    assert all(torch.equal(got[1][key], expected[1][key]) for key in expected[1])

    held = {"scale": torch.tensor(2.0)}
    reads_elsewhere = CompiledOnce(lambda x: (x * held["scale"],), "compiled")
    assert reads_elsewhere(torch.ones(3))[0].tolist() == [2.0] * 3
    assert reads_elsewhere.direct is None
    # a result this does not pack (a dict of dicts): the frame packs it
    nested = CompiledOnce(lambda x: (x + 1, {"inner": {"sum": x.sum()}}), "compiled")
    assert nested(torch.ones(4, 3))[1]["inner"]["sum"].tolist() == [3.0] * 4 and nested.direct is None
    holding_nothing = CompiledOnce(lambda x: (x + 1, {"sum": x.sum(), "none": {}}), "compiled")
    assert holding_nothing(torch.ones(4, 3))[1]["none"] == {} and holding_nothing.direct is None


class PPOCountingEpochs(PPO):
    """Overrides the update loop (run_epochs) without saying how it trains in a population."""

    epochs_run = 0

    def run_epochs(self, epoch_batches, optimizer):
        type(self).epochs_run += 1
        return super().run_epochs(epoch_batches, optimizer)


def test_an_undeclared_override_of_the_update_loop_is_refused_and_once_declared_runs_its_own_code_per_seed(
        monkeypatch, tmp_path):
    # The declaration is the capability: a vectorized population would skip run_epochs, so it refuses the class
    # until the class says population_update; declared "per_seed", each seed's update runs the class's own code.
    from benchmarks.engine.validate import ConfigError, validate_config

    monkeypatch.setitem(ALGORITHMS, "ppo", PPOCountingEpochs)
    cfg = compose_config([*short_run("CartPole", "ppo", 1), "seeds=[0,1]"])
    with pytest.raises(ConfigError) as error:
        validate_config(cfg)
    assert str(error.value) == (
        "algo.backend=compiled: PPOCountingEpochs overrides run_epochs, which the population's vectorized update "
        "does not run; declare population_update = \"per_seed\" in the class (its own update, seed by seed), or "
        "\"vectorized\" if the override changes nothing a population must run")
    monkeypatch.setattr(PPOCountingEpochs, "population_update", "per_seed", raising=False)
    validate_config(cfg)  # declared: accepted
    train_batch(cfg, [tmp_path / "a", tmp_path / "b"])
    assert PPOCountingEpochs.epochs_run == 2  # each seed's own run_epochs, once per update


@pytest.mark.parametrize("seeds", [[0], [0, 1]])
def test_hp3o_trains_compiled_through_epochs_of_different_minibatch_counts(seeds, compiled, tmp_path):
    # HP3O's hybrid batches change size from epoch to epoch (and seed to seed), so the population's count of
    # minibatch steps per epoch changes; the compiled program must still be the one compiled first (no recompile),
    # for a population of one (whose seed axis has size 1) as for more.
    overrides = [*short_run("CartPole", "hp3o", 4), f"seeds={seeds}", "algo.minibatch_size=64"]
    summaries = train_batch(compose_config(overrides), [tmp_path / f"seed{s}" for s in seeds])
    assert [summary["status"] for summary in summaries] == ["complete"] * len(seeds)
    log = pd.read_csv(tmp_path / "seed0" / "train.csv")
    assert log["buffer_fill"].iloc[-1] > 0 and log["batch_steps"].nunique() > 1


class TimingMixin:
    """A mixin that replaces the update loop: the override comes from beside PPO, not below it."""

    def run_epochs(self, epoch_batches, optimizer):
        return PPO.run_epochs(self, epoch_batches, optimizer)


class PPOWithMixin(TimingMixin, PPO):
    pass


def test_an_override_from_a_mixin_is_refused_too():
    from algorithms.population import undeclared_overrides

    assert undeclared_overrides(PPOWithMixin) == ["run_epochs"]
    assert undeclared_overrides(ALGORITHMS["hp3o"]) == [] and undeclared_overrides(PPO) == []


def test_a_stopped_hp3o_seed_takes_no_step_and_stops_nothing_else(eager):
    # A stopped seed's rollout has no valid rows (HP3O would cut it into zero minibatches); the others train on.
    from benchmarks.engine.batch_trainer import RandomState
    from tests.test_outer_ppo import synthetic_rollout

    cfg = compose_config(["algo=hp3o", "env=HalfCheetah", "algo.backend=compiled"])
    torch.manual_seed(0)
    members = [ALGORITHMS["hp3o"](17, 6, False, cfg.algo, 10) for _ in range(2)]
    population = PopulationBatch(members, [RandomState() for _ in members])
    stopped = synthetic_rollout(members[1], 17, num_steps=64, num_envs=2, seed=1)
    stopped.valid[:] = False
    before = [p.clone() for p in members[1].policy.parameters()]
    stats = population.update([synthetic_rollout(members[0], 17, num_steps=64, num_envs=2), stopped], 1, [True, False])
    assert stats[1] is None and stats[0]["policy_loss"] == stats[0]["policy_loss"]  # finite, not NaN
    assert all(torch.equal(a, b) for a, b in zip(before, members[1].policy.parameters()))


@pytest.mark.parametrize("env, obs_dim, action_dim, discrete", [("HalfCheetah", 17, 6, False), ("CartPole", 4, 2, True)])
def test_the_bootstrap_value_is_each_seeds_critic_and_moves_no_stream(env, obs_dim, action_dim, discrete, compiled):
    # The act program computes V(obs) beside the action; the bootstrap after a rollout (inside the rollout's block
    # of unchecked calls) reads it from there, on the draws the last act call left, drawing nothing.
    import numpy as np

    from benchmarks.engine.batch_trainer import RandomState

    cfg = compose_config(["algo=ppo", f"env={env}"])
    torch.manual_seed(0)
    members = [ALGORITHMS["ppo"](obs_dim, action_dim, discrete, cfg.algo, 10) for _ in range(3)]
    randoms = [RandomState() for _ in members]
    population = PopulationBatch(members, randoms)
    assert population.unchecked_calls().programs == [population.acting, population.steps[0].step]  # no other
    obs = np.random.default_rng(0).normal(size=(3, 2, obs_dim)).astype(np.float32)
    with population.unchecked_calls():
        population.act(obs, np.ones(3, dtype=bool))
        _, _, acted_value = population.act(obs, np.ones(3, dtype=bool))
        draws, streams = population.draws, [seed.torch.get_state() for seed in randoms]
        values = population.value(obs)
    assert population.draws is draws and all(torch.equal(before, seed.torch.get_state())
                                             for before, seed in zip(streams, randoms))
    np.testing.assert_array_equal(values, acted_value)  # the same program, the same numbers
    for index, member in enumerate(members):  # each seed's own critic, eager: equal up to rounding
        expected = member.policy.value(torch.from_numpy(obs[index])).detach()
        torch.testing.assert_close(torch.from_numpy(values[index]), expected, rtol=1e-5, atol=1e-6)


class PPOUnclipped(PPO):
    """Declares its one phase without the gradient clip: eager and population runs must both honour it."""

    def update_phases(self):
        from algorithms.ppo import Phase

        return [Phase()]


def test_a_variant_that_redeclares_its_phases_is_trained_by_them_eagerly_and_in_a_population(eager):
    from tests.test_outer_ppo import synthetic_rollout

    cfg = compose_config(["algo=ppo", "env=HalfCheetah", "algo.backend=torch"])
    torch.manual_seed(0)
    clipped, unclipped = PPO(17, 6, False, cfg.algo, 10), PPOUnclipped(17, 6, False, cfg.algo, 10)
    unclipped.policy.load_state_dict(clipped.policy.state_dict())
    rollout = synthetic_rollout(clipped, 17, num_steps=64, num_envs=2, seed=1)
    torch.manual_seed(1)
    stats = unclipped.update(rollout, 1)
    assert "grad_norm" not in stats and "explained_variance" not in stats  # its phase, not PPO's epoch loop

    from benchmarks.engine.batch_trainer import RandomState

    member = PPOUnclipped(17, 6, False, cfg.algo, 10)
    member.policy.load_state_dict(clipped.policy.state_dict())
    torch.manual_seed(1)
    population = PopulationBatch([member], [RandomState()])
    got = population.update([rollout], 1, [True])[0]
    assert list(got) == list(stats)
    for a, b in zip(unclipped.policy.parameters(), member.policy.parameters()):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)


class PPOWithTemperature(PPO):
    """Its optimizer also steps a parameter outside the policy, which a population never sees."""

    def build_optimizer(self):
        self.temperature = torch.nn.Parameter(torch.ones(()))
        return torch.optim.Adam([*self.trained_parameters(), self.temperature], lr=self.cfg.lr)


class PPOWholeBatchesFromEpochBatches(PPO):
    def update_phases(self):
        from algorithms.ppo import Phase

        return [Phase(whole_batch=True)]


def test_a_population_refuses_a_parameter_outside_the_policy_and_a_whole_batch_phase_of_unknown_size():
    from algorithms.population import population_problems

    cfg = compose_config(["algo=ppo", "env=CartPole", "algo.backend=compiled"])
    assert population_problems(PPOWithTemperature(4, 2, True, cfg.algo, 10)) == [
        "PPOWithTemperature's optimizer steps a parameter outside its policy: the population's vectorized update "
        "steps the policy's parameters only; declare population_update = \"per_seed\" in the class"]
    assert population_problems(PPOWholeBatchesFromEpochBatches(4, 2, True, cfg.algo, 10)) == [
        "PPOWholeBatchesFromEpochBatches's phase loss_terms takes whole batches from epoch_batches: a population "
        "pads a whole batch to the rollout's size only, so give the phase its number of epochs"]


def test_each_seeds_minibatches_are_its_permutation_cut_as_tensor_split_cuts_it():
    """minibatch_rows lays each seed's permutation into [minibatches, seeds, width] slabs in two blocks: minibatch m
    of seed i holds what torch.tensor_split gives as piece m of the same permutation (the first count % split one row
    longer), the rest padding (row 0, mask 0), and every generator ends where drawing the permutations leaves it. Even
    and uneven cuts, fewer rows than minibatches, a seed without rows and one that takes no step."""
    from types import SimpleNamespace

    from algorithms.population import minibatch_rows

    cases = [([2048], [32], 64), ([512, 500, 37, 0], [4, 4, 3, 1], 128), ([7, 9, 130, 5], [3, 2, 5, 0], 64),
             ([3], [5], 1)]
    for counts, splits, width in cases:
        for shuffled in (True, False):
            streams = [SimpleNamespace(torch=torch.Generator().manual_seed(seed)) for seed in range(len(counts))]
            rows, mask = minibatch_rows(counts, splits, width, streams, shuffled=shuffled)
            assert rows.shape == mask.shape == (max(splits), len(counts), width)
            for seed, (count, split) in enumerate(zip(counts, splits)):
                generator = torch.Generator().manual_seed(seed)
                pieces = []
                if split:
                    permutation = torch.randperm(count, generator=generator) if shuffled else torch.arange(count)
                    pieces = torch.tensor_split(permutation, split)
                for m in range(max(splits)):
                    piece = pieces[m] if m < len(pieces) else torch.zeros(0, dtype=torch.long)
                    assert torch.equal(rows[m, seed, :len(piece)], piece), (counts, seed, m)
                    assert torch.equal(rows[m, seed, len(piece):], torch.zeros(width - len(piece), dtype=torch.long))
                    assert torch.equal(mask[m, seed], (torch.arange(width) < len(piece)).float())
                assert torch.equal(streams[seed].torch.get_state(), generator.get_state())
