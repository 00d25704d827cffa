"""Outer-PPO (docs/algorithms.md section 3): the identity with PPO, the outer step, the variants, state, presets.

Fast by construction: short rollouts, one eval episode, no TensorBoard. Tests
that need a learning signal use the real trainer; tests of the outer machinery
use a synthetic rollout (the PPO loss does not care where its data came from).
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from algorithms import ALGORITHMS
from algorithms.core import Rollout
from algorithms.outer_ppo import OuterPPO
from benchmarks.engine.trainer import train
from benchmarks.engine.validate import ConfigError, validate_config

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ["outer_ppo", "outer_ppo_lr", "outer_ppo_nesterov", "outer_ppo_biased"]
FAST = [
    "eval.episodes=1",
    "eval.at_start=false",
    "logging.tensorboard=false",
    "logging.progress_bar=false",
    "logging.checkpoint=false",
]
# Outer-PPO that must be PPO: inner = PPO's Adam (outer_ppo_lr's inner), outer SGD(lr=1, momentum=0).
AS_PPO = ["algo=outer_ppo_lr", "algo.outer_optimizer.lr=1.0", "algo.outer_optimizer.momentum=0.0"]


def make_config(*overrides: str):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def train_recording(cfg, run_dir: Path, monkeypatch) -> object:
    """benchmarks.engine.trainer.train, returning the trained algorithm with every sampled action batch recorded."""
    OmegaConf.resolve(cfg)  # algo.backend's default reads the registry, patched below
    kind = cfg.algo.algorithm
    algorithm_class = ALGORITHMS[kind]
    built = []

    def build_and_record(*args):
        algorithm = algorithm_class(*args)
        algorithm.initial_parameters = [p.detach().clone() for p in algorithm.policy.parameters()]
        algorithm.sampled_actions = []
        act = algorithm.act

        def recording_act(obs):
            action, log_prob, value = act(obs)
            algorithm.sampled_actions.append(action.clone())
            return action, log_prob, value

        algorithm.act = recording_act
        built.append(algorithm)
        return algorithm

    monkeypatch.setitem(ALGORITHMS, kind, build_and_record)
    train(cfg, run_dir)
    return built[0]


def max_abs_diff(params_a, params_b) -> float:
    return max(float((a.detach().double() - b.detach().double()).abs().max()) for a, b in zip(params_a, params_b))


def synthetic_rollout(algorithm, obs_dim: int, num_steps: int = 16, num_envs: int = 2, seed: int = 0) -> Rollout:
    """Random observations and rewards, actions sampled from the policy; one termination per env."""
    generator = torch.Generator().manual_seed(seed)
    obs = torch.randn(num_steps, num_envs, obs_dim, generator=generator)
    with torch.no_grad():  # act() takes a [batch, obs_dim] batch, as in the trainer
        actions, log_probs, values = algorithm.policy.act(obs.reshape(-1, obs_dim))
    action_shape = tuple(actions.shape[1:])
    rollout = Rollout.allocate(num_steps, num_envs, obs_dim, action_shape)
    rollout.obs = obs
    rollout.actions = actions.reshape((num_steps, num_envs) + action_shape)
    rollout.log_probs = log_probs.reshape(num_steps, num_envs)
    rollout.values = values.reshape(num_steps, num_envs)
    rollout.rewards = torch.randn(num_steps, num_envs, generator=generator)
    rollout.terminated[num_steps // 2] = True
    return rollout


def build_outer(*overrides: str, obs_dim: int = 4, action_dim: int = 2, num_iterations: int = 10,
                algorithm_class=OuterPPO):
    """The torch backend unless the overrides say otherwise: these tests redo autograd updates by hand."""
    cfg = make_config("algo.backend=torch", *overrides)
    validate_config(cfg)
    return algorithm_class(obs_dim, action_dim, True, cfg.algo, num_iterations)


def parameters(algorithm) -> list[torch.Tensor]:
    return [p.detach().clone() for p in algorithm.policy.parameters()]


# ---------------------------------------------------------------------------
# (a) The key identity: inner = PPO's Adam, outer SGD(lr=1) is PPO
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "task",
    [
        ["env=CartPole", "total_steps=2048"],  # 4 iterations of 4 envs x 128 steps
        # Continuous, with obs normalisation and reward scaling; 4 iterations of 4 envs x 64 steps.
        ["env=Pendulum", "env.num_steps=64", "total_steps=1024"],
    ],
    ids=["CartPole", "Pendulum"],
)
@pytest.mark.parametrize("backend", ["compiled", "torch"])
@pytest.mark.slow
def test_outer_sgd_lr1_with_ppo_inner_optimizer_is_ppo(task, backend, tmp_path, monkeypatch):
    ppo = train_recording(make_config("algo=ppo", f"algo.backend={backend}", *task, *FAST), tmp_path / "ppo",
                          monkeypatch)
    outer = train_recording(make_config(*AS_PPO, f"algo.backend={backend}", *task, *FAST), tmp_path / "outer",
                            monkeypatch)

    assert isinstance(outer, OuterPPO)
    assert max_abs_diff(ppo.initial_parameters, outer.initial_parameters) == 0.0
    # The run must have moved the parameters, or the comparison proves nothing.
    assert max_abs_diff(ppo.initial_parameters, parameters(ppo)) > 1e-3
    assert max_abs_diff(parameters(ppo), parameters(outer)) <= 1e-6
    if backend == "compiled":  # the population acts for its seeds (one program), not through algorithm.act
        return
    assert len(ppo.sampled_actions) == len(outer.sampled_actions) > 0
    for ppo_actions, outer_actions in zip(ppo.sampled_actions, outer.sampled_actions):
        if ppo.policy.discrete:
            assert torch.equal(ppo_actions, outer_actions)
        else:  # mean + std * noise: same noise, parameters equal up to float32 rounding
            assert float((ppo_actions - outer_actions).abs().max()) <= 1e-5


# ---------------------------------------------------------------------------
# (b) The outer step itself
# ---------------------------------------------------------------------------


def capture_inner_result(algorithm) -> dict:
    """Wrap the inner loop (PPO.optimize) so that theta*_k is recorded after it."""
    captured = {}
    inner_loop = algorithm.optimize

    def optimize_and_capture(batch, optimizer):
        stats = inner_loop(batch, optimizer)
        captured["theta_star"] = parameters(algorithm)
        return stats

    algorithm.optimize = optimize_and_capture
    return captured


def test_outer_lr_zero_leaves_behaviour_parameters_unchanged(tmp_path, monkeypatch):
    cfg = make_config("algo=outer_ppo_lr", "algo.outer_optimizer.lr=0.0", "env=CartPole", "total_steps=1024", *FAST)
    validate_config(cfg)  # lr 0 is allowed on purpose
    algorithm = train_recording(cfg, tmp_path / "run", monkeypatch)
    assert max_abs_diff(algorithm.initial_parameters, parameters(algorithm)) == 0.0


def test_outer_lr_zero_on_actor_only_still_trains_the_critic():
    algorithm = build_outer("algo=outer_ppo", "algo.outer_optimizer.lr=0.0", "algo.apply_to=actor",
                            "algo.inner_loop=ppo")
    actor_before = [p.detach().clone() for p in algorithm.policy.actor_parameters()]
    critic_before = [p.detach().clone() for p in algorithm.policy.critic.parameters()]
    captured = capture_inner_result(algorithm)
    algorithm.update(synthetic_rollout(algorithm, obs_dim=4), 1)
    assert max_abs_diff(actor_before, algorithm.policy.actor_parameters()) == 0.0
    # The critic is outside the outer step: it keeps theta*_k of the inner loop.
    critic_after = [p.detach() for p in algorithm.policy.critic.parameters()]
    critic_star = captured["theta_star"][: len(critic_after)]  # ActorCritic registers the critic first
    assert max_abs_diff(critic_before, critic_after) > 1e-4
    assert max_abs_diff(critic_star, critic_after) == 0.0


@pytest.mark.parametrize("sigma", [0.5, 2.0])
def test_sgd_outer_step_is_sigma_times_inner_displacement(sigma):
    torch.manual_seed(0)
    algorithm = build_outer("algo=outer_ppo_lr", f"algo.outer_optimizer.lr={sigma}")
    captured = capture_inner_result(algorithm)
    for iteration in (1, 2):
        theta_k = parameters(algorithm)
        stats = algorithm.update(synthetic_rollout(algorithm, obs_dim=4, seed=iteration), iteration)
        applied = [after.double() - before.double() for after, before in zip(parameters(algorithm), theta_k)]
        expected = [sigma * (star.double() - before.double()) for star, before in zip(captured["theta_star"], theta_k)]
        assert max_abs_diff(expected, [torch.zeros_like(e) for e in expected]) > 1e-4  # the inner loop moved
        assert max_abs_diff(applied, expected) <= 1e-7  # float32 rounding of theta_k +- step only
        assert stats["outer_step_norm"] == pytest.approx(sigma * stats["outer_grad_norm"], rel=1e-5)


def test_an_annealed_outer_lr_decays_as_ppos_and_a_constant_one_does_not():
    """outer_optimizer.anneal_lr (every preset keeps it false): the outer step at iteration 6 of 10 is half the
    outer lr's times g; without it, the whole lr's."""
    for anneal, factor in ((True, 0.5), (False, 1.0)):
        torch.manual_seed(0)
        algorithm = build_outer("algo=outer_ppo_lr", "algo.outer_optimizer.lr=0.8",
                                f"algo.outer_optimizer.anneal_lr={str(anneal).lower()}", num_iterations=10)
        captured = capture_inner_result(algorithm)
        theta_k = parameters(algorithm)
        stats = algorithm.update(synthetic_rollout(algorithm, obs_dim=4, seed=6), iteration=6)
        applied = [after.double() - before.double() for after, before in zip(parameters(algorithm), theta_k)]
        expected = [0.8 * factor * (star.double() - before.double())
                    for star, before in zip(captured["theta_star"], theta_k)]
        assert max_abs_diff(applied, expected) <= 1e-7
        assert stats["outer_lr"] == pytest.approx(0.8 * factor, rel=1e-12)


# ---------------------------------------------------------------------------
# (c) Nesterov momentum and the biased start against a hand computation
# ---------------------------------------------------------------------------


class QuadraticInnerLoop(OuterPPO):
    """Toy problem: the inner loop is one inner-optimizer step on 0.5 * ||theta - target||^2.

    With inner SGD(lr=c) that gives theta* = start - c * (start - target), which the
    tests below redo by hand; the outer machinery (OuterPPO.update) is the real one.
    """

    def optimize(self, batch, optimizer):
        optimizer.zero_grad()
        loss = sum(0.5 * (p - target).pow(2).sum() for p, target in zip(self.policy.parameters(), self.targets))
        loss.backward()
        optimizer.step()
        return {}


INNER_C = 0.25
TOY_INNER = ["algo.inner_optimizer.type=sgd", f"algo.inner_optimizer.lr={INNER_C}", "algo.anneal_lr=false"]


def build_toy(*overrides: str):
    algorithm = build_outer("algo=outer_ppo_lr", *TOY_INNER, *overrides, obs_dim=3, algorithm_class=QuadraticInnerLoop)
    generator = torch.Generator().manual_seed(1)
    algorithm.targets = [torch.randn(p.shape, generator=generator) for p in algorithm.policy.parameters()]
    theta = torch.cat([p.detach().reshape(-1) for p in algorithm.policy.parameters()]).double()
    target = torch.cat([t.reshape(-1) for t in algorithm.targets]).double()
    return algorithm, theta, target


def flat_parameters(algorithm) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in algorithm.policy.parameters()]).double()


def test_nesterov_outer_momentum_matches_hand_computation():
    sigma, mu = 0.7, 0.6
    algorithm, theta, target = build_toy(
        f"algo.outer_optimizer.lr={sigma}", f"algo.outer_optimizer.momentum={mu}", "algo.outer_optimizer.nesterov=true"
    )
    rollout = synthetic_rollout(algorithm, obs_dim=3)
    buffer = torch.zeros_like(theta)
    previous_g = None
    for iteration in (1, 2, 3):
        # Hand computation: g = theta - theta*, b = mu b + g, theta <- theta - sigma (g + mu b).
        theta_star = theta - INNER_C * (theta - target)
        g = theta - theta_star
        buffer = mu * buffer + g
        theta = theta - sigma * (g + mu * buffer)

        stats = algorithm.update(rollout, iteration)
        assert float((flat_parameters(algorithm) - theta).abs().max()) <= 1e-5
        assert stats["outer_grad_norm"] == pytest.approx(float(g.norm()), rel=1e-5)
        if previous_g is None:
            assert math.isnan(stats["outer_grad_cosine"])
        else:
            cos = float(g @ previous_g / (g.norm() * previous_g.norm()))
            assert stats["outer_grad_cosine"] == pytest.approx(cos, abs=1e-5)
        previous_g = g
    # Without momentum the third iterate differs: the test sees the momentum.
    plain, plain_theta, _ = build_toy(f"algo.outer_optimizer.lr={sigma}")
    for iteration in (1, 2, 3):
        plain.update(rollout, iteration)
    assert float((flat_parameters(plain) - theta).abs().max()) > 1e-3


def test_biased_start_matches_hand_computation():
    sigma, bias = 1.5, 0.5
    algorithm, theta, target = build_toy(f"algo.outer_optimizer.lr={sigma}", f"algo.bias_coef={bias}")
    rollout = synthetic_rollout(algorithm, obs_dim=3)
    previous_update = torch.zeros_like(theta)  # no previous outer update at iteration 1
    for iteration in (1, 2, 3):
        # Hand computation: start = theta + bias * u, theta* = start - c (start - target),
        # g = theta - theta* (from theta, not from the start), u = -sigma g.
        start = theta + bias * previous_update
        theta_star = start - INNER_C * (start - target)
        g = theta - theta_star
        previous_update = -sigma * g
        theta = theta + previous_update

        stats = algorithm.update(rollout, iteration)
        assert float((flat_parameters(algorithm) - theta).abs().max()) <= 1e-5
        assert stats["outer_grad_norm"] == pytest.approx(float(g.norm()), rel=1e-5)
        assert stats["outer_step_norm"] == pytest.approx(float(previous_update.norm()), rel=1e-5)
    unbiased, _, _ = build_toy(f"algo.outer_optimizer.lr={sigma}")
    for iteration in (1, 2, 3):
        unbiased.update(rollout, iteration)
    assert float((flat_parameters(unbiased) - theta).abs().max()) > 1e-3


# ---------------------------------------------------------------------------
# (d) Optimizer state across iterations and in checkpoints
# ---------------------------------------------------------------------------


def test_inner_optimizer_state_carries_over_iterations():
    torch.manual_seed(0)
    algorithm = build_outer("algo=outer_ppo_lr")
    steps_per_update = algorithm.cfg.update_epochs * algorithm.cfg.num_minibatches
    first_param = next(algorithm.policy.parameters())
    algorithm.update(synthetic_rollout(algorithm, obs_dim=4, seed=1), 1)
    first_moment = algorithm.inner_optimizer.state[first_param]["exp_avg"]
    assert float(algorithm.inner_optimizer.state[first_param]["step"]) == steps_per_update
    algorithm.update(synthetic_rollout(algorithm, obs_dim=4, seed=2), 2)
    # Same Adam, continued: the step count keeps growing and the moment buffer is the same tensor.
    assert float(algorithm.inner_optimizer.state[first_param]["step"]) == 2 * steps_per_update
    assert algorithm.inner_optimizer.state[first_param]["exp_avg"] is first_moment


@pytest.mark.parametrize(
    "overrides",
    [["algo=outer_ppo"], ["algo=outer_ppo_nesterov", "algo.bias_coef=0.5"]],
    ids=["adamw", "nesterov_biased"],
)
def test_checkpoint_round_trips_outer_state(overrides):
    torch.manual_seed(0)
    original = build_outer(*overrides)
    for iteration in (1, 2):
        original.update(synthetic_rollout(original, obs_dim=4, seed=iteration), iteration)

    buffer = io.BytesIO()
    torch.save(original.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert state["outer_optimizer"]["state"], "the outer optimizer's state must be in the checkpoint"
    assert state["previous_outer_grad"] is not None and state["previous_outer_update"] is not None

    restored = build_outer(*overrides)
    restored.load_state_dict(state)
    fresh = build_outer(*overrides)
    fresh.policy.load_state_dict(state["policy"])  # same parameters, no optimizer state
    rollout = synthetic_rollout(original, obs_dim=4, seed=3)
    results = {}
    for name, algorithm in [("original", original), ("restored", restored), ("fresh", fresh)]:
        torch.manual_seed(123)  # same minibatch shuffles for all three
        stats = algorithm.update(rollout, 3)
        results[name] = (parameters(algorithm), stats)
    assert max_abs_diff(results["original"][0], results["restored"][0]) == 0.0
    assert results["original"][1]["outer_grad_cosine"] == results["restored"][1]["outer_grad_cosine"]
    # Losing the optimizer state changes the step: the checkpoint is what carries it.
    assert max_abs_diff(results["original"][0], results["fresh"][0]) > 1e-6


# ---------------------------------------------------------------------------
# (e) Presets: compose, validate, run one iteration; validation rejects bad values
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("env", ["CartPole", "HalfCheetah"])
@pytest.mark.parametrize("preset", PRESETS)
def test_preset_runs_one_iteration(preset, env, tmp_path):
    probe = make_config(f"algo={preset}", f"env={env}")
    one_rollout = probe.env.num_envs * probe.env.num_steps
    cfg = make_config(f"algo={preset}", f"env={env}", f"total_steps={one_rollout}", *FAST)
    validate_config(cfg)
    assert cfg.algo.name == preset and cfg.algo.algorithm == "outer_ppo"
    summary = train(cfg, tmp_path)
    assert summary["iterations"] == 1 and math.isfinite(summary["final_eval_return_mean"])
    with open(tmp_path / "train.csv") as file:
        (row,) = list(csv.DictReader(file))
    for column in ("outer_grad_norm", "outer_step_norm", "outer_kl"):
        assert math.isfinite(float(row[column])), column
    assert math.isnan(float(row["outer_grad_cosine"]))  # no g_{k-1} at the first iteration


def test_user_default_preset_is_exactly_as_asked():
    algo = make_config("algo=outer_ppo").algo
    assert (algo.inner_optimizer.type, algo.inner_optimizer.lr, algo.inner_optimizer.momentum) == ("sgd", 1.0, 0.0)
    assert algo.outer_optimizer.type == "adamw"


@pytest.mark.parametrize(
    "override, key",
    [
        ("algo.outer_optimizer.type=rmsprop", "algo.outer_optimizer.type"),
        ("algo.inner_optimizer.lr=0.0", "algo.inner_optimizer.lr"),
        ("algo.outer_optimizer.lr=-0.1", "algo.outer_optimizer.lr"),
        ("algo.outer_optimizer.momentum=1.0", "algo.outer_optimizer.momentum"),
        ("algo.outer_optimizer.betas=[0.9,1.0]", "algo.outer_optimizer.betas"),
        ("algo.inner_optimizer.eps=0.0", "algo.inner_optimizer.eps"),
        ("algo.outer_optimizer.weight_decay=-1.0", "algo.outer_optimizer.weight_decay"),
        ("algo.bias_coef=-0.5", "algo.bias_coef"),
        ("algo.apply_to=critic", "algo.apply_to"),
        ("algo.outer_optimizer.nesterov=yes", "algo.outer_optimizer.nesterov"),
        # momentum on adamw would be ignored (its momentum is betas[0]): refused.
        ("algo.outer_optimizer.momentum=0.5", "algo.outer_optimizer "),
    ],
)
def test_validation_rejects_bad_outer_ppo_values(override, key):
    with pytest.raises(ConfigError) as error:
        validate_config(make_config("algo=outer_ppo", override))
    assert str(error.value).startswith(key)


def test_sensitivity_experiment_composes_with_its_grid():
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["+experiment=outer_sensitivity"], return_hydra_config=True)
    params = cfg.hydra.sweeper.params
    assert set(params) == {"algo.outer_optimizer.lr", "algo.outer_optimizer.momentum", "seed"}
    # One directory per grid point, so no two jobs of the sweep write to the same place.
    outer = cfg.algo.outer_optimizer
    assert cfg.hydra.sweep.subdir == f"{cfg.env.name}/sigma{outer.lr}_mu{outer.momentum}/seed{cfg.seed}"
    del cfg.hydra
    validate_config(cfg)
    assert cfg.algo.name == "outer_ppo_nesterov" and cfg.algo.outer_optimizer.nesterov


# ---------------------------------------------------------------------------
# (f) The named preset: full-batch SGD(lr 1) on the surrogate, outer AdamW
# ---------------------------------------------------------------------------


def test_the_bare_headline_command_runs_the_mujoco_tuning_values_in_the_full_batch_form():
    """python run.py algo=outer_ppo env=HalfCheetah: the 1M-step study's values with no extra argument (its effective
    outer step, where the 300k round's values stepped at sigma_eff 0.04 and did not learn)."""
    from omegaconf import OmegaConf

    cfg = make_config("algo=outer_ppo", "env=HalfCheetah")
    values = OmegaConf.load(ROOT / "conf" / "tuning" / "mujoco_1m.yaml")
    assert cfg.algo.lr == values.hparams.lr and cfg.algo.inner_epochs == values.tuned.outer_ppo.inner_epochs
    assert cfg.algo.outer_optimizer.lr == values.tuned.outer_ppo.outer_lr
    assert cfg.algo.outer_optimizer.sigma_eff == values.tuned.outer_ppo.sigma_eff
    assert list(cfg.algo.outer_optimizer.betas) == [values.tuned.outer_ppo.beta1, values.tuned.outer_ppo.beta2]
    assert cfg.algo.inner_loop == "full_batch" and cfg.algo.inner_optimizer.type == "sgd"
    assert cfg.algo.inner_optimizer.lr == 1.0 and cfg.algo.outer_optimizer.type == "adamw"


@pytest.mark.parametrize("discrete", [True, False], ids=["discrete", "continuous"])
def test_named_preset_inner_loop_is_full_batch_sgd_then_outer_adamw(discrete):
    """4 full-batch SGD(lr 1) steps on the clipped surrogate from theta, then ONE AdamW step on the actor
    with .grad = theta - theta*, redone by hand; the critic is fitted apart and never enters the actor's step."""
    import copy

    # the preset as designed (the MuJoCo tuning kept the full-batch form and chose 14 inner steps)
    cfg = make_config("algo=outer_ppo", "env=HalfCheetah", "+tuning=mujoco_shipped")
    validate_config(cfg)
    assert cfg.algo.inner_loop == "full_batch" and cfg.algo.inner_epochs == 4
    assert cfg.algo.inner_optimizer.type == "sgd" and cfg.algo.inner_optimizer.lr == 1.0
    assert cfg.algo.outer_optimizer.type == "adamw"
    algorithm = OuterPPO(5, 3, discrete, cfg.algo, num_iterations=10)
    rollout = synthetic_rollout(algorithm, obs_dim=5, num_steps=32)
    batch = algorithm.flatten_rollout(rollout)
    reference = copy.deepcopy(algorithm.policy)
    critic_before = [p.detach().clone() for p in algorithm.policy.critic.parameters()]
    inner_loop, captured = algorithm.optimize, {}

    def optimize_and_capture(batch, optimizer):
        stats = inner_loop(batch, optimizer)
        captured["theta_star"] = [p.detach().clone() for p in algorithm.policy.actor_parameters()]
        return stats

    algorithm.optimize = optimize_and_capture
    algorithm.update(rollout, iteration=1)  # iteration 1: the annealed inner lr is still 1.0

    # By hand. The surrogate: -mean(min(r A, clip(r, 1 - eps, 1 + eps) A)), A normalised over the whole batch.
    theta = [p.detach().clone() for p in reference.actor_parameters()]
    advantages = batch["advantages"]
    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    eps = cfg.algo.clip_coef
    for _ in range(4):
        head = reference.actor(batch["obs"])
        if discrete:
            log_prob = torch.log_softmax(head, -1).gather(-1, batch["actions"].long().unsqueeze(-1)).squeeze(-1)
        else:
            std = reference.actor_logstd.exp()
            log_prob = (-0.5 * ((batch["actions"] - head) / std) ** 2 - reference.actor_logstd
                        - 0.5 * math.log(2 * math.pi)).sum(-1)
        ratio = (log_prob - batch["log_probs"]).exp()
        surrogate = -torch.min(ratio * advantages, ratio.clamp(1 - eps, 1 + eps) * advantages).mean()
        grads = torch.autograd.grad(surrogate, reference.actor_parameters())
        with torch.no_grad():
            for param, grad in zip(reference.actor_parameters(), grads):
                param -= 1.0 * grad  # SGD, lr 1, no momentum, no clipping
    theta_star = [p.detach() for p in reference.actor_parameters()]
    assert max_abs_diff(theta_star, theta) > 1e-3  # the inner loop moved: the checks below mean something
    assert max_abs_diff(captured["theta_star"], theta_star) <= 1e-6
    outer = cfg.algo.outer_optimizer
    beta1, beta2 = outer.betas
    expected = []
    # AdamW's first step on g = theta - theta*, from the algorithm's own theta*: its first step is about lr * sign(g),
    # so a weight the inner loop barely moved (|g| near eps) would carry theta*'s rounding into the step in full
    for start, end in zip(theta, captured["theta_star"]):
        g = start - end
        m_hat = (1 - beta1) * g / (1 - beta1)
        v_hat = (1 - beta2) * g * g / (1 - beta2)
        expected.append(start * (1 - outer.lr * outer.weight_decay) - outer.lr * m_hat / (v_hat.sqrt() + outer.eps))

    assert max_abs_diff(algorithm.policy.actor_parameters(), expected) <= 1e-6
    critic_after = list(algorithm.policy.critic.parameters())
    assert max_abs_diff(critic_after, critic_before) > 1e-4  # fitted, by PPO's Adam on the value loss


def test_named_preset_full_batch_checkpoint_round_trip(tmp_path):
    """The critic's own optimizer is part of the state: a reloaded agent takes the same next update."""
    cfg = make_config("algo=outer_ppo", "env=HalfCheetah")
    first = OuterPPO(4, 2, True, cfg.algo, num_iterations=10)
    first.update(synthetic_rollout(first, obs_dim=4, seed=1), iteration=1)
    torch.save(first.state_dict(), tmp_path / "state.pt")
    second = OuterPPO(4, 2, True, cfg.algo, num_iterations=10)
    second.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    rollout = synthetic_rollout(first, obs_dim=4, seed=2)
    torch.manual_seed(0)
    first.update(rollout, iteration=2)
    torch.manual_seed(0)
    second.update(rollout, iteration=2)
    assert max_abs_diff(parameters(first), parameters(second)) == 0.0


# ---------------------------------------------------------------------------
# (f) The effective outer step sigma_eff = |theta_{k+1} - theta_k| / |g_k|
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("sigma_eff", [0.1, 3.0])
def test_sigma_eff_rescales_the_adamw_step_to_sigma_times_g(sigma_eff):
    """The named preset with outer_optimizer.sigma_eff: AdamW's own first step (done by hand, lr 1), rescaled so
    that its norm is sigma_eff * |g|; logged as outer_sigma_eff, with the lr the step was taken with."""
    algorithm = build_outer("algo=outer_ppo", "env=HalfCheetah", "+tuning=mujoco_shipped", "algo.outer_optimizer.lr=1.0",
                            f"algo.outer_optimizer.sigma_eff={sigma_eff}", "algo.outer_optimizer.weight_decay=0.01",
                            obs_dim=4)
    assert algorithm.full_batch
    captured, run_phase = {}, algorithm.run_phase

    def run_phase_and_capture(phase, batch):  # theta*_k of the actor, where the full-batch inner steps end
        stats = run_phase(phase, batch)
        if phase.loss == "inner_loss_terms":
            captured["actor_star"] = [p.detach().clone() for p in algorithm.policy.actor_parameters()]
        return stats

    algorithm.run_phase = run_phase_and_capture
    theta_k = [p.detach().clone() for p in algorithm.policy.actor_parameters()]
    stats = algorithm.update(synthetic_rollout(algorithm, obs_dim=4), iteration=1)
    outer = algorithm.cfg.outer_optimizer
    star = captured["actor_star"]
    unit_step = []  # AdamW's first step at lr 1 on g = theta - theta*: -(wd * theta + g / (|g| + eps))
    for start, end in zip(theta_k, star):
        g = (start - end).double()
        unit_step.append(-(outer.weight_decay * start.double() + g / (g.abs() + outer.eps)))
    g_norm = torch.cat([(a - b).double().reshape(-1) for a, b in zip(theta_k, star)]).norm()
    scale = sigma_eff * g_norm / torch.cat([u.reshape(-1) for u in unit_step]).norm()
    expected = [start.double() + scale * u for start, u in zip(theta_k, unit_step)]
    assert max_abs_diff(algorithm.policy.actor_parameters(), expected) <= 1e-6
    assert stats["outer_sigma_eff"] == pytest.approx(sigma_eff, rel=1e-5)
    assert stats["outer_lr"] == pytest.approx(float(scale), rel=1e-5)


def test_sigma_eff_is_logged_for_every_outer_step():
    algorithm = build_outer("algo=outer_ppo_lr", "algo.outer_optimizer.lr=0.5")
    for iteration in (1, 2):
        stats = algorithm.update(synthetic_rollout(algorithm, obs_dim=4, seed=iteration), iteration)
        assert stats["outer_sigma_eff"] == pytest.approx(0.5, rel=1e-5)  # SGD: the step is lr * g


def test_sigma_eff_refuses_an_lr_it_would_ignore():
    with pytest.raises(ConfigError) as error:
        validate_config(make_config("algo=outer_ppo", "env=HalfCheetah", "algo.outer_optimizer.sigma_eff=1.0",
                                    "algo.outer_optimizer.lr=0.001"))
    assert str(error.value).startswith("algo.outer_optimizer.lr must be 1.0 when algo.outer_optimizer.sigma_eff is "
                                       "set")


def test_a_target_kl_the_full_batch_inner_loop_would_ignore_is_refused():
    with pytest.raises(ConfigError) as error:
        validate_config(make_config("algo=outer_ppo", "env=HalfCheetah", "algo.target_kl=0.01"))
    assert str(error.value) == ("algo.target_kl must be null with algo.inner_loop=full_batch (got 0.01): it stops PPO's "
                                "epochs, and the full-batch inner loop runs none (algo.inner_loop=ppo does)")
    validate_config(make_config("algo=outer_ppo", "env=HalfCheetah", "algo.target_kl=0.01", "algo.inner_loop=ppo"))


@pytest.mark.parametrize("tune, env", [("mujoco_1m", "HalfCheetah"), ("classic_pruned", "CartPole")])
def test_the_named_presets_pruned_search_covers_sigma_eff_from_0_1_to_3(tune, env):
    from benchmarks.tuning import distribution, tune_config

    sweeper = tune_config(tune)["hydra"]["sweeper"]
    space = {key: spec for key, spec in sweeper["search_spaces"]["outer_ppo"].items() if spec is not None}
    sigma = distribution("sigma_eff", space["env.tuned.outer_ppo.sigma_eff"])
    assert sigma.low <= 0.1 and sigma.high >= 3.0 and sigma.log
    assert "env.tuned.outer_ppo.outer_lr" not in space  # with sigma_eff set the lr has no effect: not searched
    assert {"env.tuned.outer_ppo.beta1", "env.tuned.outer_ppo.beta2"} <= set(space)  # AdamW's betas searched
    cfg = make_config("algo=outer_ppo", f"env={env}", f"+tuning={tune}")
    validate_config(cfg)  # the round's values compose into a valid config: lr 1.0 beside sigma_eff
    assert 0.1 <= cfg.algo.outer_optimizer.sigma_eff <= 3.0 and cfg.algo.outer_optimizer.lr == 1.0
