"""HP3O / HP3O+ (docs/algorithms.md section 4): trajectory buffer, stitching, hybrid batches, targets, presets."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from conftest import QUIET, compose_config
from omegaconf import OmegaConf

from algorithms.core import Rollout
from algorithms.hp3o import HP3O, Trajectory, TrajectoryBuffer
from benchmarks.engine.checkpoint import read_checkpoint
from benchmarks.engine.trainer import train
from benchmarks.engine.validate import ConfigError, validate_config

ROUNDING = 4 * torch.finfo(torch.float32).eps  # a few float32 ulps around 1
COMPARED_FIELDS = ("obs", "actions", "rewards", "log_probs", "values", "advantages", "returns",
                   "raw_return", "terminated", "truncated", "bootstrap_value")


def algo_config(**changes):
    """The real hp3o preset (CartPole), resolved, with some keys changed."""
    base = compose_config(["algo=hp3o", "env=CartPole"]).algo
    return OmegaConf.merge(OmegaConf.create(OmegaConf.to_container(base, resolve=True)), changes)


def make_hp3o(discrete: bool = True, **changes) -> HP3O:
    return HP3O(obs_dim=4, action_dim=2, discrete=discrete, cfg=algo_config(**changes), num_iterations=100)


def build_rollout(T: int, N: int, ends: dict, policy=None, seed: int = 0) -> Rollout:
    """Random rows; ends maps (row, env) -> "terminated" | "truncated"; the row after an end is a reset row.

    With a policy, actions / log-probs / values are its own (as the trainer records them).
    """
    generator = torch.Generator().manual_seed(seed)
    rollout = Rollout.allocate(T, N, 4, ())
    rollout.obs.copy_(torch.randn(T, N, 4, generator=generator))
    rollout.rewards.copy_(torch.randn(T, N, generator=generator))
    rollout.raw_rewards.copy_(torch.randn(T, N, generator=generator))
    rollout.next_value = torch.randn(N, generator=generator)
    if policy is None:
        rollout.actions.copy_(torch.randint(0, 2, (T, N), generator=generator).float())
        rollout.log_probs.copy_(-torch.rand(T, N, generator=generator))
        rollout.values.copy_(torch.randn(T, N, generator=generator))
    else:
        with torch.inference_mode():
            for t in range(T):
                action, log_prob, value = policy.act(rollout.obs[t])
                rollout.actions[t], rollout.log_probs[t], rollout.values[t] = action, log_prob, value
    for (t, env), kind in ends.items():
        getattr(rollout, kind)[t, env] = True
        if t + 1 < T:
            rollout.valid[t + 1, env] = False
    return rollout


def slice_rollout(full: Rollout, start: int, stop: int) -> Rollout:
    """Rows start..stop-1 as a rollout of their own; next_value is V of the obs after the last row."""
    fields = ("obs", "actions", "log_probs", "values", "rewards", "raw_rewards", "terminated", "truncated", "valid")
    part = Rollout(**{f: getattr(full, f)[start:stop].clone() for f in fields}, next_value=None)
    part.next_value = full.values[stop].clone() if stop < full.num_steps else full.next_value.clone()
    return part


def make_trajectory(ident: int, length: int, raw_return: float) -> Trajectory:
    """obs[:, 0] = ident and obs[:, 1] = step index: every sampled row says where it came from."""
    obs = torch.zeros(length, 4)
    obs[:, 0] = ident
    obs[:, 1] = torch.arange(length)
    zeros = torch.zeros(length)
    return Trajectory(obs=obs, actions=zeros.clone(), rewards=torch.ones(length), log_probs=zeros - 0.7,
                      values=zeros.clone(), collected_at=torch.ones(length, dtype=torch.int64),
                      advantages=torch.randn(length), returns=torch.randn(length), raw_return=raw_return,
                      terminated=True, truncated=False, bootstrap_value=0.0, completed_at=1)


def assert_same_trajectory(a: Trajectory, b: Trajectory) -> None:
    for name in COMPARED_FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, torch.Tensor):
            torch.testing.assert_close(x, y, rtol=0, atol=0, msg=name)
        else:
            assert x == y, name


# -- buffer -------------------------------------------------------------------------


def test_fifo_evicts_the_oldest_first():
    buffer = TrajectoryBuffer(capacity=3)
    for ident in range(5):
        buffer.push(make_trajectory(ident, 4, raw_return=float(ident)))
        assert len(buffer) == min(ident + 1, 3)
    assert [int(t.obs[0, 0]) for t in buffer.trajectories] == [2, 3, 4]
    buffer.push(make_trajectory(5, 4, raw_return=-1.0))  # evicts 2 even though 5 is the worst
    assert [int(t.obs[0, 0]) for t in buffer.trajectories] == [3, 4, 5]


def test_draws_are_without_replacement_uniform_and_take_all_when_fewer():
    torch.manual_seed(0)
    buffer = TrajectoryBuffer(capacity=8)
    for ident, ret in enumerate([1.0, 5.0, 9.0, 2.0, 3.0, 0.0, 4.0, 8.0]):
        buffer.push(make_trajectory(ident, 4, ret))
    counts = torch.zeros(8)
    draws = 3000
    for _ in range(draws):
        chosen = buffer.draw_indices(4)
        assert chosen[0] == 2 and len(chosen) == 4 and len(set(chosen)) == 4
        counts[chosen] += 1
    others = torch.cat([counts[:2], counts[3:]]) / draws
    assert torch.allclose(others, torch.full_like(others, 3 / 7), atol=0.05)  # 3 of the 7 others, uniformly
    small = TrajectoryBuffer(capacity=8)
    for ident in range(3):
        small.push(make_trajectory(ident, 4, float(ident)))
    assert sorted(small.draw_indices(5)) == [0, 1, 2]


def test_best_trajectory_is_in_every_epoch_and_steps_are_drawn_without_replacement():
    hp3o = make_hp3o(buffer_size=8, trajectories_per_batch=4, steps_per_batch=40, minibatch_size=16,
                     update_epochs=12)
    lengths = [30, 6, 25, 12, 40, 9, 18, 22]
    for ident, (length, ret) in enumerate(zip(lengths, [1.0, 5.0, 2.0, 9.0, 3.0, 0.0, 4.0, 8.0])):
        hp3o.buffer.push(make_trajectory(ident, length, ret))
    recorded = []
    original = hp3o.draw_hybrid_batch

    def recording(targets):
        batch, chosen = original(targets)
        recorded.append((batch, chosen))
        return batch, chosen

    hp3o.draw_hybrid_batch = recording
    hp3o.update(build_rollout(8, 2, ends={}), iteration=2)  # no episode ends: the buffer stays as built
    assert len(recorded) == 12
    for batch, chosen in recorded:
        assert chosen[0] == 3 and len(set(chosen)) == 4
        source = batch["obs"][:, :2].long()
        pairs = {tuple(row) for row in source.tolist()}
        assert len(pairs) == len(source)  # no step twice
        for ident in chosen:  # up to S/k = 10 steps from each chosen trajectory
            assert int((source[:, 0] == ident).sum()) == min(10, lengths[ident])
        assert set(source[:, 0].tolist()) == set(chosen)


# -- stitching and targets -----------------------------------------------------------


# env 0: episode rows 0-3 terminated, reset row 4, rows 5-10 truncated, reset row 11.
# env 1: rows 0-6 truncated, reset row 7, rows 8-11 unfinished.
STITCH_ENDS = {(3, 0): "terminated", (10, 0): "truncated", (6, 1): "truncated"}


@pytest.mark.parametrize("split", [3, 4, 5, 7, 8, 11])
def test_episode_stitched_across_two_rollouts_equals_one_rollout(split):
    full = build_rollout(12, 2, STITCH_ENDS, seed=3)
    whole = make_hp3o()
    whole.ingest(full, iteration=1)

    stitched = make_hp3o()
    first = slice_rollout(full, 0, split)
    stitched.ingest(first, iteration=1)
    for name in ("obs", "rewards", "raw_rewards", "log_probs", "values", "actions"):
        getattr(first, name).fill_(float("nan"))  # the trainer overwrites its rollout: nothing may alias it
    stitched.ingest(slice_rollout(full, split, 12), iteration=2)

    assert len(whole.buffer) == len(stitched.buffer) == 3
    for a, b in zip(whole.buffer.trajectories, stitched.buffer.trajectories):
        assert_same_trajectory(a, b)
    assert whole.partial_episodes[0] is None and stitched.partial_episodes[0] is None
    for name in ("obs", "actions", "rewards", "raw_rewards", "log_probs", "values"):
        torch.testing.assert_close(whole.partial_episodes[1][name], stitched.partial_episodes[1][name], rtol=0, atol=0)
    collected_at = [t.collected_at for t in stitched.buffer.trajectories]
    collected_at.append(stitched.partial_episodes[1]["collected_at"])
    assert any(c.unique().numel() == 2 for c in collected_at)  # every split cuts at least one episode


def test_state_dict_round_trips_buffer_and_partial_episodes(tmp_path):
    hp3o = make_hp3o()
    hp3o.ingest(build_rollout(12, 2, STITCH_ENDS, seed=3), iteration=1)  # env 0: no partial (None), env 1: one
    torch.save(hp3o.state_dict(), tmp_path / "state.pt")
    restored = make_hp3o()
    restored.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    assert len(restored.buffer) == len(hp3o.buffer) == 3
    for a, b in zip(hp3o.buffer.trajectories, restored.buffer.trajectories):
        assert_same_trajectory(a, b)
        assert torch.equal(a.collected_at, b.collected_at) and a.completed_at == b.completed_at
    assert restored.partial_episodes[0] is None
    for name, value in hp3o.partial_episodes[1].items():
        assert torch.equal(value, restored.partial_episodes[1][name])
    # and it carries on: the restored partial episode completes on the next rollout
    restored.ingest(build_rollout(4, 2, {(1, 1): "terminated"}, seed=9), iteration=2)
    assert len(restored.buffer[-1]) == 4 + 2  # rows 8-11 of the first rollout + rows 0-1 of the second


@pytest.mark.parametrize("ending", ["terminated", "truncated", "truncated_on_last_row"])
def test_terminated_and_truncated_endings_give_the_right_targets(ending):
    gamma, lam = 0.9, 0.8
    hp3o = make_hp3o(gamma=gamma, gae_lambda=lam)
    T = 3 if ending == "truncated_on_last_row" else 5
    rollout = build_rollout(T, 1, ends={(2, 0): ending.split("_")[0]})
    rollout.rewards[:3, 0] = torch.tensor([1.0, 2.0, 3.0])
    rollout.values[:3, 0] = torch.tensor([0.5, 0.25, 0.75])
    v_final = 2.0  # V(final obs): the reset row's value, or next_value when the episode ends the rollout
    if T > 3:
        rollout.values[3, 0] = v_final
    else:
        rollout.next_value = torch.tensor([v_final])
    hp3o.ingest(rollout, iteration=1)

    (trajectory,) = hp3o.buffer.trajectories
    bootstrap = 0.0 if ending == "terminated" else v_final
    d2 = 3.0 + gamma * bootstrap - 0.75
    d1 = 2.0 + gamma * 0.75 - 0.25
    d0 = 1.0 + gamma * 0.25 - 0.5
    a2 = d2
    a1 = d1 + gamma * lam * a2
    a0 = d0 + gamma * lam * a1
    expected = torch.tensor([a0, a1, a2])
    torch.testing.assert_close(trajectory.advantages, expected)
    torch.testing.assert_close(trajectory.returns, expected + torch.tensor([0.5, 0.25, 0.75]))
    assert trajectory.bootstrap_value == bootstrap
    assert trajectory.terminated == (ending == "terminated") and trajectory.truncated == (ending != "terminated")


def test_reset_rows_never_enter_the_buffer():
    generator = torch.Generator().manual_seed(5)
    hp3o = make_hp3o(buffer_size=1000)
    kept_steps = 0
    previous_last_ended = None  # set at the end of each iteration, read from the second on
    for iteration in range(1, 6):
        ends = {}
        for env in range(3):
            for t in torch.nonzero(torch.rand(20, generator=generator) < 0.25).flatten().tolist():
                ends[(t, env)] = "terminated" if t % 2 else "truncated"
        rollout = build_rollout(20, 3, ends, seed=iteration)
        if iteration > 1:
            rollout.valid[0] = ~previous_last_ended  # the row after an end on the previous rollout's last row
        resets = ~rollout.valid
        rollout.obs[resets] = 1e6
        rollout.raw_rewards[resets] = 1e6
        rollout.rewards[resets] = 1e6
        kept_steps += int(rollout.valid.sum())
        hp3o.ingest(rollout, iteration)
        previous_last_ended = rollout.terminated[-1] | rollout.truncated[-1]
    stored = [t.obs for t in hp3o.buffer.trajectories]
    stored += [p["obs"] for p in hp3o.partial_episodes if p is not None]
    assert sum(o.shape[0] for o in stored) == kept_steps
    assert all((o < 1e5).all() for o in stored)
    assert all(t.raw_return < 1e5 and (t.rewards < 1e5).all() for t in hp3o.buffer.trajectories)


def test_buffer_never_exceeds_capacity_over_many_iterations():
    generator = torch.Generator().manual_seed(7)
    hp3o = make_hp3o(buffer_size=4, trajectories_per_batch=3, steps_per_batch=24, minibatch_size=12, update_epochs=1)
    for iteration in range(1, 41):
        ends = {(t, env): "terminated" for env in range(2)
                for t in torch.nonzero(torch.rand(16, generator=generator) < 0.3).flatten().tolist()}
        stats = hp3o.update(build_rollout(16, 2, ends, seed=iteration), iteration)
        assert len(hp3o.buffer) <= 4 and stats["buffer_fill"] <= 4
        ages = [iteration - t.completed_at for t in hp3o.buffer.trajectories]
        assert ages == sorted(ages, reverse=True)  # oldest first, newest last
    assert len(hp3o.buffer) == 4


# -- the ratio against stored behaviour log-probs ---------------------------------------


def batch_ratios(hp3o: HP3O) -> tuple[torch.Tensor, torch.Tensor]:
    batch, _ = hp3o.draw_hybrid_batch(hp3o.update_targets())
    with torch.no_grad():
        new_log_prob, _, _ = hp3o.policy.evaluate(batch["obs"], batch["actions"])
    return (new_log_prob - batch["log_probs"]).exp(), batch["collected_at"]


def test_old_trajectories_give_ratios_off_one_and_fresh_ones_exactly_one():
    """Fresh steps: ratio 1 up to float32 rounding. The loss evaluates the network on a batch
    of another shape than acting did, and BLAS may then sum in another order (seen: 1 ulp,
    6e-8, on a few rows); the same shape gives bit-identical log-probs (checked below)."""
    torch.manual_seed(0)
    hp3o = make_hp3o(buffer_size=50, trajectories_per_batch=50, steps_per_batch=5000, update_epochs=3,
                     minibatch_size=32)
    ends = {(t, env): "terminated" for env in range(2) for t in (5, 12, 20)}
    hp3o.ingest(build_rollout(24, 2, ends, policy=hp3o.policy, seed=1), iteration=1)
    ratios, _ = batch_ratios(hp3o)
    assert (ratios - 1).abs().max() <= ROUNDING

    hp3o.update(build_rollout(24, 2, {}, policy=hp3o.policy, seed=2), iteration=2)  # gradient steps
    fresh_rollout = build_rollout(24, 2, ends, policy=hp3o.policy, seed=3)
    hp3o.ingest(fresh_rollout, iteration=3)
    ratios, collected_at = batch_ratios(hp3o)  # before any gradient step of iteration 3
    fresh = collected_at == 3
    assert fresh.any() and (~fresh).any()
    assert (ratios[fresh] - 1).abs().max() <= ROUNDING
    assert (ratios[~fresh] - 1).abs().max() > 1e-3
    with torch.no_grad():  # acting's batch shape: exactly the stored behaviour log-probs
        same_shape = torch.stack([hp3o.policy.evaluate(fresh_rollout.obs[t], fresh_rollout.actions[t])[0]
                                  for t in range(24)])
    assert torch.equal(same_shape, fresh_rollout.log_probs)


# -- HP3O+ and recomputed advantages --------------------------------------------------------


def test_best_trajectory_baseline_replaces_only_close_higher_values():
    gamma, lam = 0.9, 0.8
    hp3o = make_hp3o(best_baseline=True, baseline_distance_threshold=1.0, gamma=gamma, gae_lambda=lam)
    best = make_trajectory(0, 2, raw_return=100.0)
    best.obs = torch.tensor([[0.0, 0, 0, 0], [10.0, 0, 0, 0]])
    best.values = torch.tensor([5.0, 5.0])
    other = make_trajectory(1, 3, raw_return=0.0)
    other.obs = torch.tensor([[0.1, 0, 0, 0], [10.1, 0, 0, 0], [11.5, 0, 0, 0]])
    other.values = torch.tensor([1.0, 9.0, 1.0])
    other.rewards = torch.zeros(3)
    hp3o.buffer.push(best)
    hp3o.buffer.push(other)

    targets = hp3o.update_targets()
    # row 0: close and higher -> replaced; row 1: close but lower; row 2: higher, but at distance 1.5 > 1
    assert targets[1]["replaced"].tolist() == [True, False, False]
    assert not targets[0]["replaced"].any()
    baseline = torch.tensor([5.0, 9.0, 1.0])
    d2 = 0.0 - baseline[2]  # terminated: no bootstrap
    d1 = 0.0 + gamma * 1.0 - baseline[1]
    d0 = 0.0 + gamma * 9.0 - baseline[0]
    a1 = d1 + gamma * lam * d2
    expected = torch.stack([d0 + gamma * lam * a1, a1, d2])
    torch.testing.assert_close(targets[1]["advantages"], expected)
    torch.testing.assert_close(targets[1]["returns"], other.returns)  # critic targets unchanged
    torch.testing.assert_close(targets[0]["advantages"], best.advantages)

    plain = make_hp3o(best_baseline=False)
    plain.buffer.push(best)
    plain.buffer.push(other)
    assert not any(t["replaced"].any() for t in plain.update_targets())


def test_recomputed_advantages_use_the_current_critic():
    hp3o = make_hp3o(recompute_advantages=True)
    hp3o.ingest(build_rollout(24, 2, {(9, 0): "terminated", (15, 1): "truncated"}, seed=4), iteration=1)
    targets = hp3o.update_targets()
    for trajectory, target in zip(hp3o.buffer.trajectories, targets):
        with torch.no_grad():
            torch.testing.assert_close(target["values"], hp3o.policy.value(trajectory.obs))
        torch.testing.assert_close(target["returns"], target["advantages"] + target["values"])
        assert not torch.allclose(target["values"], trajectory.values)  # the stored ones were random


def test_fallback_update_before_any_complete_episode_logs_the_same_columns():
    hp3o = make_hp3o(update_epochs=2)
    fallback = hp3o.update(build_rollout(16, 2, {}), iteration=1)
    assert len(hp3o.buffer) == 0 and fallback["buffer_fill"] == 0
    hybrid = hp3o.update(build_rollout(16, 2, {(3, 0): "terminated"}), iteration=2)
    assert len(hp3o.buffer) == 1
    assert list(fallback) == list(hybrid)  # train.csv columns are fixed by the first row


# -- configs and real runs ---------------------------------------------------------------


def test_config_rules_reject_bad_values():
    for preset in ("hp3o", "hp3o_plus"):
        validate_config(compose_config([f"algo={preset}"]))
    bad = {
        "algo.trajectories_per_batch=21": "trajectories_per_batch",  # > buffer_size 20
        "algo.steps_per_batch=4": "steps_per_batch",  # < k = 5
        "algo.buffer_size=0": "buffer_size",
        "algo.minibatch_size=0": "minibatch_size",
        "algo.baseline_distance_threshold=0": "baseline_distance_threshold",
        "algo.best_baseline=1": "best_baseline",
        "algo.recompute_advantages=yes": "recompute_advantages",
    }
    for override, key in bad.items():
        with pytest.raises(ConfigError, match=key):
            validate_config(compose_config(["algo=hp3o", override]))


TASK_DIMS = {"CartPole": (4, 2, True), "Pendulum": (3, 1, False), "HalfCheetah": (17, 6, False)}


@pytest.mark.parametrize("preset", ["hp3o", "hp3o_plus"])
@pytest.mark.parametrize("env_name,rollouts", [("CartPole", 2), ("Pendulum", 1), ("HalfCheetah", 1)])
def test_presets_compose_and_run(preset, env_name, rollouts, tmp_path):
    probe = compose_config([f"algo={preset}", f"env={env_name}"])
    steps = rollouts * probe.env.num_envs * probe.env.num_steps
    cfg = compose_config([f"algo={preset}", f"env={env_name}", f"total_steps={steps}", *QUIET])
    validate_config(cfg)
    summary = train(cfg, tmp_path)
    assert summary["status"] == "complete" and summary["iterations"] == rollouts
    log = pd.read_csv(tmp_path / "train.csv")
    assert (log["buffer_fill"] >= 1).all() and (log["buffer_fill"] <= cfg.algo.buffer_size).all()
    for column in ("buffer_mean_age", "buffer_best_return", "old_policy_fraction", "ratio_mean", "ratio_max"):
        assert log[column].notna().all(), column
    assert log["baseline_replaced_fraction"].notna().all() == (preset == "hp3o_plus")

    checkpoint = read_checkpoint(tmp_path / "checkpoint.pt")
    saved = checkpoint["algorithm"]
    obs_dim, action_dim, discrete = TASK_DIMS[env_name]
    restored = HP3O(obs_dim, action_dim, discrete, cfg.algo, num_iterations=rollouts)
    restored.load_state_dict(saved)
    assert len(restored.buffer) == log["buffer_fill"].iloc[-1]
    assert len(restored.partial_episodes) == cfg.env.num_envs


# -- which trajectory is the best --------------------------------------------------------


def test_the_best_trajectory_is_chosen_by_the_envs_own_return_not_the_scaled_rewards():
    """Two episodes whose scaled rewards rank them one way and raw rewards the other: the raw return decides."""
    hp3o = make_hp3o(buffer_size=10)
    rollout = build_rollout(8, 2, {(7, 0): "terminated", (7, 1): "terminated"}, seed=3)
    rollout.rewards[:, 0], rollout.rewards[:, 1] = 10.0, -10.0          # env 0 looks best to the loss
    rollout.raw_rewards[:, 0], rollout.raw_rewards[:, 1] = -1.0, 1.0    # env 1 is best in the env's own terms
    hp3o.ingest(rollout, 1)
    returns = [t.raw_return for t in hp3o.buffer.trajectories]
    assert sorted(returns) == [-8.0, 8.0]
    best = hp3o.buffer[hp3o.buffer.best_index()]
    assert best.raw_return == 8.0 and float(best.rewards.sum()) == -80.0


def test_the_oldest_of_tied_best_trajectories_wins_and_an_evicted_best_hands_over():
    buffer = TrajectoryBuffer(capacity=3)
    for ident, raw_return in ((0, 5.0), (1, 9.0), (2, 9.0)):  # 1 and 2 tie: the older, 1, is the best
        buffer.push(make_trajectory(ident, 4, raw_return))
    assert int(buffer[buffer.best_index()].obs[0, 0]) == 1
    assert buffer.draw_indices(1) == [buffer.best_index()]
    buffer.push(make_trajectory(3, 4, 1.0))  # evicts 0
    assert int(buffer[buffer.best_index()].obs[0, 0]) == 1
    buffer.push(make_trajectory(4, 4, 2.0))  # evicts 1, the best: the tie's other member takes over
    assert int(buffer[buffer.best_index()].obs[0, 0]) == 2
    buffer.push(make_trajectory(5, 4, 3.0))  # evicts 2: the best of what is left, 5
    assert int(buffer[buffer.best_index()].obs[0, 0]) == 5
