"""algo.backend=numpy computes what the torch backend computes: gradients, statistics, actions, learning.

The numpy backend writes the PPO loss's derivative out by hand, so every
branch of it is checked against torch autograd here: clipped and unclipped
ratios of both signs of advantage, clipped and unclipped value errors, the
gradient-norm clip on and off, discrete and continuous policies.
"""

import numpy as np
import pytest
import torch
from conftest import QUIET

from algorithms.ppo import PPO
from benchmarks.engine.trainer import train

TASKS = {"HalfCheetah": (17, 6, False), "CartPole": (4, 2, True)}


def twin_algorithms(make_config, env, *overrides):
    """A torch-backend and a numpy-backend PPO with the same parameters, each with plain SGD at lr 1."""
    obs_dim, action_dim, discrete = TASKS[env]
    algorithms = []
    for backend in ("torch", "numpy"):
        cfg = make_config([f"env={env}", "algo=ppo", f"algo.backend={backend}", *overrides])
        torch.manual_seed(0)
        algorithm = PPO(obs_dim, action_dim, discrete, cfg.algo, num_iterations=10)
        algorithms.append(algorithm)
    if not discrete:
        with torch.no_grad():  # a log std away from 0, so that its gradient terms are not trivially 1 or 0
            for algorithm in algorithms:
                algorithm.policy.actor_logstd.copy_(torch.linspace(-0.7, 0.4, action_dim))
    return algorithms


def synthetic_minibatch(algorithm, batch_size=64, seed=1):
    """Stored log-probs and values far enough from the current ones that about half the ratios and value
    errors are clipped, with advantages of both signs."""
    obs_dim = algorithm.policy.critic.layers[0].in_features
    generator = torch.Generator().manual_seed(seed)
    obs = torch.randn(batch_size, obs_dim, generator=generator)
    with torch.no_grad():
        if algorithm.policy.discrete:
            actions = torch.randint(0, algorithm.policy.actor.layers[-1].out_features, (batch_size,),
                                    generator=generator).float()
        else:
            head = algorithm.policy.actor(obs)
            actions = head + torch.randn(head.shape, generator=generator)
        log_prob, _, values = algorithm.policy.evaluate(obs, actions)
    return {
        "obs": obs,
        "actions": actions,
        "log_probs": log_prob + 0.3 * torch.randn(batch_size, generator=generator),
        "values": values + 0.4 * torch.randn(batch_size, generator=generator),
        "advantages": torch.randn(batch_size, generator=generator) * 2.0 + 0.3,
        "returns": values + torch.randn(batch_size, generator=generator),
    }


@pytest.mark.parametrize("env", sorted(TASKS))
@pytest.mark.parametrize("max_grad_norm", [0.5, 1e6])  # clipped / not clipped
@pytest.mark.parametrize("ent_coef", [0.0, 0.01])
def test_minibatch_step_matches_autograd(env, max_grad_norm, ent_coef, make_config):
    reference, candidate = twin_algorithms(make_config, env, f"algo.max_grad_norm={max_grad_norm}",
                                           f"algo.ent_coef={ent_coef}")
    minibatch = synthetic_minibatch(reference)
    ratio = (reference.policy.evaluate(minibatch["obs"], minibatch["actions"])[0] - minibatch["log_probs"]).exp()
    assert 0.2 < ((ratio - 1).abs() > 0.2).float().mean() < 0.8  # both branches of the clip are exercised
    before = [p.detach().clone() for p in reference.policy.parameters()]
    sgd = [torch.optim.SGD(algorithm.trained_parameters(), lr=1.0) for algorithm in (reference, candidate)]

    expected = {k: float(v) for k, v in reference.minibatch_step(minibatch, sgd[0]).items()}
    got = candidate.minibatch_step(minibatch, sgd[1])

    assert list(got) == list(expected)  # same keys, same order: the same train.csv columns
    for key in expected:
        assert got[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-6), key
    for (name, ref_param), new_param, start in zip(reference.policy.named_parameters(),
                                                   candidate.policy.parameters(), before):
        ref_step, new_step = ref_param.detach() - start, new_param.detach() - start
        assert ref_step.abs().max() > 0, name  # every parameter gets a gradient
        torch.testing.assert_close(new_step, ref_step, rtol=1e-4, atol=1e-7, msg=name)


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("env", sorted(TASKS))
def test_act_draws_the_same_random_numbers(env, seed, make_config):
    reference, candidate = twin_algorithms(make_config, env)
    obs = torch.randn(8, TASKS[env][0], generator=torch.Generator().manual_seed(seed))
    results = []
    for algorithm in (reference, candidate):
        torch.manual_seed(seed)
        with torch.inference_mode():
            results.append(algorithm.act(obs))
        results.append(torch.rand(()))  # the generator ends in the same state
    (ref_action, ref_log_prob, ref_value), ref_next, (action, log_prob, value), next_draw = results
    assert next_draw == ref_next
    if TASKS[env][2]:
        assert torch.equal(action, ref_action)
    else:
        torch.testing.assert_close(action, ref_action, rtol=0, atol=1e-6)
    torch.testing.assert_close(log_prob, ref_log_prob, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(value, ref_value, rtol=1e-6, atol=1e-6)
    assert action.dtype == ref_action.dtype and log_prob.dtype == torch.float32 and value.dtype == torch.float32


def test_numpy_views_follow_in_place_parameter_changes(make_config):
    """Optimizer steps, load_state_dict and Outer-PPO's copy_ all write into the same memory the views read."""
    _, candidate = twin_algorithms(make_config, "HalfCheetah")
    other = PPO(17, 6, False, make_config(["env=HalfCheetah", "algo=ppo"]).algo, num_iterations=10)
    candidate.policy.load_state_dict(other.policy.state_dict())  # copies into the views' memory
    obs = torch.randn(3, 17)
    with torch.inference_mode():
        expected = other.policy.value(obs)
        _, _, value = candidate.act(obs)
    torch.testing.assert_close(value, expected, rtol=1e-6, atol=1e-6)


def test_every_preset_trains_on_the_numpy_backend(make_config, tmp_path):
    for algo in ("outer_ppo_nesterov", "hp3o_plus"):
        cfg = make_config(["env=Pendulum", f"algo={algo}", "algo.backend=numpy", "total_steps=4096", *QUIET])
        summary = train(cfg, tmp_path / algo)
        assert summary["status"] == "complete" and np.isfinite(summary["final_eval_return_mean"])


@pytest.mark.slow
def test_ppo_learns_cartpole_on_the_numpy_backend(make_config, tmp_path):
    """The same fixed-seed, loose-bound check as the torch backend's (test_trainer.py)."""
    cfg = make_config(["env=CartPole", "algo.backend=numpy", "total_steps=40960", "eval.every_steps=40960",
                       "eval.episodes=10", "logging.tensorboard=false", "logging.progress_bar=false"])
    summary = train(cfg, tmp_path)
    assert summary["final_eval_return_mean"] >= 150
