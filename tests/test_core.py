"""Pure pieces of the shared core against hand computations."""

import math

import numpy as np
import pytest
import torch

from algorithms.core import (
    ActorCritic,
    RewardScaler,
    RunningMeanStd,
    clipped_policy_loss,
    compute_gae,
    merge_moments,
    merge_one_row,
    value_loss,
)


def column(*xs, dtype=torch.float32):
    return torch.tensor(xs, dtype=dtype).unsqueeze(1)  # [T, 1]


def test_gae_termination_truncation_and_reset_step_by_hand():
    # One env, 6 rows:
    #   t0 normal, t1 terminated, t2 reset row (obs = t1's final obs), t3 truncated,
    #   t4 reset row (obs = t3's true final obs: bootstrap source), t5 normal, then next_value.
    gamma, lam = 0.9, 0.8
    rewards = column(1.0, 2.0, 0.0, 3.0, 0.0, 4.0)
    values = column(0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
    next_value = torch.tensor([1.1])
    terminated = column(0, 1, 0, 0, 0, 0, dtype=torch.bool)
    truncated = column(0, 0, 0, 1, 0, 0, dtype=torch.bool)
    valid = column(1, 1, 0, 1, 0, 1, dtype=torch.bool)

    adv, ret = compute_gae(rewards, values, next_value, terminated, truncated, valid, gamma, lam)

    a5 = 4.0 + gamma * 1.1 - 1.0                      # bootstraps from next_value
    a3 = 3.0 + gamma * 0.9 - 0.8                      # truncated: bootstraps V(final obs) = values[4], stops
    a1 = 2.0 - 0.6                                    # terminated: no bootstrap, stops
    a0 = (1.0 + gamma * 0.6 - 0.5) + gamma * lam * a1
    expected = torch.tensor([a0, a1, 0.0, a3, 0.0, a5]).unsqueeze(1)
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(ret, (expected + values) * valid, rtol=0, atol=1e-6)
    # Reset rows carry nothing.
    assert adv[2].item() == 0.0 and adv[4].item() == 0.0 and ret[2].item() == 0.0


def test_gae_reset_row_values_do_not_leak_into_terminated_advantage():
    # Terminated row 0 must not see row 1's value even if it is huge.
    rewards, terminated = column(1.0, 0.0), column(1, 0, dtype=torch.bool)
    truncated, valid = column(0, 0, dtype=torch.bool), column(1, 0, dtype=torch.bool)
    for poison in (0.0, 1e6):
        adv, _ = compute_gae(rewards, column(0.25, poison), torch.tensor([poison]), terminated, truncated, valid, 0.99, 0.95)
        assert adv[0].item() == pytest.approx(0.75)


def test_gae_without_episode_ends_is_textbook_recursion():
    gamma, lam = 0.99, 0.95
    rewards = torch.tensor([[1.0, 0.5], [0.0, 1.0], [2.0, -1.0]])
    values = torch.tensor([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]])
    next_value = torch.tensor([0.7, 0.8])
    flags = torch.zeros(3, 2, dtype=torch.bool)
    adv, _ = compute_gae(rewards, values, next_value, flags, flags, ~flags, gamma, lam)
    for env in range(2):
        v = values[:, env].tolist() + [next_value[env].item()]
        last = 0.0
        for t in reversed(range(3)):
            last = rewards[t, env].item() + gamma * v[t + 1] - v[t] + gamma * lam * last
            assert adv[t, env].item() == pytest.approx(last, abs=1e-6)


def test_clipped_policy_loss_on_known_inputs():
    old = torch.zeros(4)
    ratios = torch.tensor([0.5, 1.0, 1.1, 1.5])
    new = ratios.log()
    adv = torch.tensor([1.0, -1.0, 2.0, 1.0])
    loss, ratio, approx_kl, clip_fraction = clipped_policy_loss(new, old, adv, clip_coef=0.2)
    # min(r*A, clip(r)*A): 0.5*1=0.5 vs 0.8*1 -> 0.5; -1; 2.2 vs 2.2 -> 2.2; 1.5 vs 1.2 -> 1.2
    assert loss.item() == pytest.approx(-(0.5 - 1.0 + 2.2 + 1.2) / 4, abs=1e-6)
    assert clip_fraction.item() == pytest.approx(0.5)  # 0.5 and 1.5 are outside [0.8, 1.2]
    expected_kl = float(((ratios - 1) - ratios.log()).mean())
    assert approx_kl.item() == pytest.approx(expected_kl, abs=1e-6)
    torch.testing.assert_close(ratio, ratios)


def test_value_loss_clipped_and_unclipped_on_known_inputs():
    new, old, ret = torch.tensor([1.0, 0.0, -1.0]), torch.tensor([0.0, 0.0, 0.0]), torch.tensor([2.0, -1.0, -2.0])
    assert value_loss(new, old, ret, None).item() == pytest.approx(0.5 * (1.0 + 1.0 + 1.0) / 3)
    # clipped predictions: row 0 up to 0.2 -> error 1.8^2 = 3.24 > 1.0; row 1 unchanged; row 2 down to -0.2 -> error
    # 1.8^2 = 3.24 > 1.0 (each side of the clip)
    assert value_loss(new, old, ret, 0.2).item() == pytest.approx(0.5 * (3.24 + 1.0 + 3.24) / 3)


def test_gaussian_log_prob_and_entropy_match_torch_distributions():
    torch.manual_seed(0)
    policy = ActorCritic(5, 3, discrete=False)
    with torch.no_grad():
        policy.actor_logstd.copy_(torch.tensor([-0.5, 0.0, 0.3]))
    obs = torch.randn(7, 5)
    action, log_prob, _ = policy.act(obs)
    mean = policy.actor(obs)
    reference = torch.distributions.Normal(mean, policy.actor_logstd.exp())
    torch.testing.assert_close(log_prob, reference.log_prob(action).sum(-1), rtol=0, atol=1e-5)
    new_log_prob, entropy, _ = policy.evaluate(obs, action)
    torch.testing.assert_close(new_log_prob, log_prob, rtol=0, atol=1e-5)
    torch.testing.assert_close(entropy, reference.entropy().sum(-1), rtol=0, atol=1e-5)


def test_the_deterministic_action_is_the_gaussians_mean_and_the_categoricals_mode():
    """What evaluation acts with (eval.csv): the mean of the Gaussian policy, the most likely discrete action."""
    torch.manual_seed(0)
    obs = torch.randn(6, 5)
    continuous = ActorCritic(5, 3, discrete=False)
    with torch.no_grad():
        continuous.actor_logstd.copy_(torch.tensor([-0.5, 0.0, 0.3]))
        torch.testing.assert_close(continuous.act_deterministic(obs), continuous.actor(obs), rtol=0, atol=0)
        discrete = ActorCritic(5, 4, discrete=True)
        probs = torch.distributions.Categorical(logits=discrete.actor(obs)).probs
        assert torch.equal(discrete.act_deterministic(obs), probs.argmax(-1))


def test_categorical_log_prob_and_entropy_match_torch_distributions():
    torch.manual_seed(0)
    policy = ActorCritic(4, 3, discrete=True)
    obs = torch.randn(9, 4) * 50  # big inputs so the logits are far from uniform
    action, log_prob, _ = policy.act(obs)
    reference = torch.distributions.Categorical(logits=policy.actor(obs))
    torch.testing.assert_close(log_prob, reference.log_prob(action), rtol=0, atol=1e-5)
    _, entropy, _ = policy.evaluate(obs, action.float())
    torch.testing.assert_close(entropy, reference.entropy(), rtol=0, atol=1e-5)


def test_network_initialisation_follows_the_spec():
    policy = ActorCritic(8, 2, discrete=False)
    head = policy.actor.layers[-1].weight
    # Orthogonal with gain 0.01: rows are orthogonal with norm 0.01.
    torch.testing.assert_close(head @ head.T, 1e-4 * torch.eye(2), rtol=0, atol=1e-9)
    assert torch.all(policy.critic.layers[-1].bias == 0)
    assert torch.all(policy.actor_logstd == 0)


def test_running_mean_std_matches_numpy_over_batches():
    rng = np.random.default_rng(0)
    data = rng.normal(3.0, 2.0, size=(300, 4))
    rms = RunningMeanStd((4,), epsilon=0.0)
    for chunk in np.split(data, [1, 50, 51, 200]):
        rms.update(chunk)
    np.testing.assert_allclose(rms.mean, data.mean(0), rtol=1e-10)
    np.testing.assert_allclose(rms.var, data.var(0), rtol=1e-10)


def test_reward_scaler_resets_at_episode_end_and_skips_reset_rows():
    scaler = RewardScaler(num_envs=1, gamma=0.5, enabled=True)
    yes, no = np.array([True]), np.array([False])
    scaler(np.array([2.0]), episode_ended=no, valid=yes)
    assert scaler.discounted_return[0] == pytest.approx(2.0)
    scaler(np.array([2.0]), episode_ended=yes, valid=yes)
    assert scaler.discounted_return[0] == 0.0  # episode over: restart
    count = scaler.rms.count
    scaler(np.array([0.0]), episode_ended=no, valid=no)  # reset row: neither counted nor decayed
    assert scaler.rms.count == count and scaler.discounted_return[0] == 0.0
    assert not math.isnan(scaler.rms.var)


# -- PPO's schedule and early stop ----------------------------------------------------------


def ppo_for_schedule(*overrides: str):
    from algorithms.ppo import PPO
    from benchmarks.engine.config import compose_config

    cfg = compose_config(["algo=ppo", "env=CartPole", "algo.backend=torch", *overrides])
    return PPO(4, 2, True, cfg.algo, num_iterations=10)


def test_the_lr_anneals_linearly_to_zero_over_the_run_and_is_what_adam_steps_with():
    from tests.test_outer_ppo import synthetic_rollout

    ppo = ppo_for_schedule("algo.lr=0.001", "algo.update_epochs=1", "algo.num_minibatches=2")
    assert [ppo.annealed_lr(i) for i in (1, 6, 10)] == pytest.approx([0.001, 0.0005, 0.0001], rel=1e-12)
    stats = ppo.update(synthetic_rollout(ppo, obs_dim=4), iteration=6)
    assert stats["lr"] == pytest.approx(0.0005, rel=1e-12)
    assert ppo.optimizer.param_groups[0]["lr"] == pytest.approx(0.0005, rel=1e-12)
    constant = ppo_for_schedule("algo.lr=0.001", "algo.anneal_lr=false")
    assert constant.annealed_lr(10) == 0.001


@pytest.mark.parametrize("switches", [("algo.clip_vloss=true", "algo.norm_adv=true"),
                                      ("algo.clip_vloss=false", "algo.norm_adv=false")])
def test_ppos_loss_is_minus_the_surrogate_plus_the_weighted_value_loss_minus_the_weighted_entropy(switches):
    """Each term's sign and coefficient, against the formula written out, with the value clip and the advantage
    normalisation on and off (the CI reference runs one setting: both on)."""
    from algorithms.ppo import sum_terms
    from tests.test_outer_ppo import synthetic_rollout

    torch.manual_seed(0)
    ppo = ppo_for_schedule("algo.ent_coef=0.3", "algo.vf_coef=0.7", "algo.clip_coef=0.1", *switches)
    clip_vloss, norm_adv = ppo.cfg.clip_vloss, ppo.cfg.norm_adv
    batch = ppo.flatten_rollout(synthetic_rollout(ppo, obs_dim=4))
    with torch.no_grad():  # move the policy so that the ratio is not 1 and the clip binds somewhere
        for parameter in ppo.policy.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    new = ppo.evaluate_minibatch(batch)
    terms = ppo.loss_terms(new, batch, {})
    assert list(terms) == ["policy", "value", "entropy"]

    stored = batch["advantages"]
    advantages = (stored - stored.mean()) / (stored.std() + 1e-8) if norm_adv else stored
    torch.testing.assert_close(new.advantages, advantages)
    ratio = (new.log_prob - batch["log_probs"]).exp()
    surrogate = torch.min(ratio * advantages, ratio.clamp(0.9, 1.1) * advantages).mean()
    value_error = (new.values - batch["returns"]) ** 2
    if clip_vloss:
        clipped_values = batch["values"] + (new.values - batch["values"]).clamp(-0.1, 0.1)
        value_error = torch.max(value_error, (clipped_values - batch["returns"]) ** 2)
    torch.testing.assert_close(terms["policy"], -surrogate)
    torch.testing.assert_close(terms["value"], 0.7 * 0.5 * value_error.mean())
    torch.testing.assert_close(terms["entropy"], -0.3 * new.entropy.mean())
    assert float(new.entropy.mean()) > 0 and (ratio - 1).abs().max() > 0.1
    assert abs(float(stored.mean())) > 0.1  # normalising changes the advantages
    torch.testing.assert_close(sum_terms(terms), terms["policy"] + terms["value"] + terms["entropy"], rtol=0, atol=0)


def test_target_kl_stops_the_epochs_after_the_first_whose_last_minibatch_exceeds_it():
    from tests.test_outer_ppo import synthetic_rollout

    def approx_kls(target_kl: float | None) -> list[float]:
        """The approx_kl of every minibatch step one update of 5 epochs x 4 minibatches takes."""
        torch.manual_seed(0)
        ppo = ppo_for_schedule("algo.update_epochs=5", "algo.num_minibatches=4",
                               f"algo.target_kl={'null' if target_kl is None else target_kl}")
        steps = []
        original = ppo.minibatch_step

        def counting(minibatch, optimizer):
            stats = original(minibatch, optimizer)
            steps.append(float(stats["approx_kl"]))
            return stats

        ppo.minibatch_step = counting
        ppo.update(synthetic_rollout(ppo, obs_dim=4, num_steps=32), iteration=1)
        return steps

    free = approx_kls(None)
    assert len(free) == 4 * 5
    first_epochs_last = free[3]  # what the check reads after the first epoch
    assert approx_kls(0.9 * first_epochs_last) == free[:4]  # exceeded: no second epoch
    later = approx_kls(1.1 * first_epochs_last)  # not exceeded: the epochs go on, the same steps
    assert len(later) > 4 and later == free[:len(later)]


def test_algorithms_import_neither_the_engine_nor_its_config_library():
    # Pure learning code: no files, envs, Hydra or omegaconf; the engine (benchmarks/) hands it plain values.
    import ast
    from pathlib import Path

    forbidden = {"benchmarks", "omegaconf", "hydra", "gymnasium"}
    for path in sorted((Path(__file__).parents[1] / "algorithms").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert name.split(".")[0] not in forbidden, f"{path.name} imports {name}"


def test_the_one_row_merge_gives_merge_moments_numbers_bit_for_bit():
    """merge_one_row (every step of a one-env run) leaves out merge_moments' multiplications by 1 and its zero
    variance: the same bits, for arrays with a seed axis and for the reward scaler's scalars, at scales from 1e-30
    to 1e30 and from a first count (1e-4) to a long run's."""
    rng = np.random.default_rng(0)
    for shape in [(17,), (3, 6), ()]:
        for _ in range(2000):
            scale = 10.0 ** rng.integers(-30, 31)
            row = rng.normal(size=shape) * scale
            mean, var = rng.normal(size=shape) * scale, rng.random(size=shape) * scale**2
            count = rng.choice([1e-4, 1.0 + rng.integers(0, 10**7)])
            if shape:
                count = np.full(shape[:-1] + (1,), count) if len(shape) > 1 else count
            expected = merge_moments(mean, var, count, row, np.zeros_like(row), 1)
            got = merge_one_row(mean, var, count, row)
            for want, have in zip(expected, got):
                assert np.asarray(have).tobytes() == np.asarray(want).tobytes()


def test_gae_gives_the_masked_recursion_bit_for_bit_on_steps_with_and_without_episode_ends():
    """compute_gae skips the masks on a step where every column continues and is valid (where they select
    nothing away): the same bits as the recursion masked at every step, on rollouts mixing both kinds of step."""
    def masked_at_every_step(rewards, values, next_value, terminated, truncated, valid, gamma, gae_lambda):
        zero = np.float32(0.0)
        next_values = np.concatenate([values[1:], next_value[None]], axis=0)
        deltas = rewards + gamma * np.where(terminated, zero, next_values) - values
        advantages, last = np.zeros_like(values), np.zeros_like(next_value)
        for t in reversed(range(values.shape[0])):
            carried = np.where(~(terminated[t] | truncated[t]), gamma * gae_lambda * last, zero)
            last = np.where(valid[t], deltas[t] + carried, zero)
            advantages[t] = last
        return advantages

    generator = torch.Generator().manual_seed(0)
    for steps, columns, end_rate in [(128, 4, 0.05), (300, 1, 0.01), (64, 8, 0.3)]:
        for _ in range(10):
            rewards, values = torch.randn(steps, columns, generator=generator) * 10, torch.randn(steps, columns, generator=generator)
            next_value = torch.randn(columns, generator=generator)
            terminated, truncated = (torch.rand(steps, columns, generator=generator) < end_rate for _ in range(2))
            valid = torch.rand(steps, columns, generator=generator) > end_rate
            advantages, _ = compute_gae(rewards, values, next_value, terminated, truncated, valid, 0.99, 0.95)
            expected = masked_at_every_step(*(x.numpy() for x in (rewards, values, next_value, terminated, truncated,
                                                                  valid)), 0.99, 0.95)
            assert advantages.numpy().tobytes() == expected.tobytes()
    for shape in [(40,), (40, 3, 2), (0, 4)]:  # one column, columns of any layout (HP3O's), no step
        rewards, values = torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)
        next_value = torch.randn(shape[1:], generator=generator)
        terminated, truncated = (torch.rand(shape, generator=generator) < 0.05 for _ in range(2))
        valid = torch.rand(shape, generator=generator) > 0.05
        advantages, _ = compute_gae(rewards, values, next_value, terminated, truncated, valid, 0.99, 0.95)
        expected = masked_at_every_step(*(x.numpy() for x in (rewards, values, next_value, terminated, truncated,
                                                              valid)), 0.99, 0.95)
        assert advantages.shape == shape and advantages.numpy().tobytes() == expected.tobytes()
