"""The shared training loop on real environments: every task, determinism, reset-row masking, learning."""

import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import QUIET, ROOT

from algorithms.core import Rollout
from algorithms.ppo import PPO
from benchmarks.engine.checkpoint import read_checkpoint
from benchmarks.engine.trainer import train
from tests.commands import run_python

ENV_NAMES = sorted(p.stem for p in (ROOT / "conf" / "env").glob("*.yaml"))
TIMING_COLUMNS = {"wall_time", "sps", "rollout_time", "update_time"}


@pytest.mark.parametrize("env_name", ENV_NAMES)
def test_every_tasks_config_names_a_registered_env_of_a_known_family(env_name, make_config):
    """Each conf/env file composes into a task that exists (its Gymnasium id registered, or module:Id importable)
    and belongs to a family the claims group by."""
    from benchmarks.claims import GROUP_FAMILIES
    from benchmarks.engine.validate import task_problems

    if env_name.startswith("RLHF"):
        pytest.importorskip("transformers", reason="the token tasks need the optional extra: pip install -e .[rlhf]")
    env = make_config([f"env={env_name}"]).env
    assert task_problems(dict(env)) == []
    assert any(env.family in families for families in GROUP_FAMILIES.values())


@pytest.mark.parametrize("env_name", ENV_NAMES)
def test_every_task_composes_and_runs_one_iteration(env_name, make_config, tmp_path):
    if env_name.startswith("RLHF"):
        pytest.importorskip("transformers", reason="the token tasks need the optional extra: pip install -e .[rlhf]")
    probe = make_config([f"env={env_name}"])
    one_rollout = probe.env.num_envs * probe.env.num_steps
    # one epoch: what runs is every task's env, policy and update; the tuned epochs only repeat it
    cfg = make_config([f"env={env_name}", f"total_steps={one_rollout}", "algo.update_epochs=1", *QUIET])
    summary = train(cfg, tmp_path)
    assert summary["status"] == "complete" and summary["iterations"] == 1
    train_log = pd.read_csv(tmp_path / "train.csv")
    assert len(train_log) == 1 and train_log["env_steps"].iloc[0] == one_rollout
    assert pd.read_csv(tmp_path / "eval.csv")["eval_return_mean"].notna().all()
    checkpoint = read_checkpoint(tmp_path / "checkpoint.pt")
    assert {"algorithm", "obs_normalizer", "reward_scaler"} <= set(checkpoint)


def numbers(run_dir: Path, name: str) -> pd.DataFrame:
    frame = pd.read_csv(run_dir / name)
    return frame.drop(columns=[c for c in frame.columns if c in TIMING_COLUMNS])


@pytest.mark.parametrize("env_name", ["CartPole", "HalfCheetah"])
@pytest.mark.slow
def test_same_seed_gives_identical_numbers(env_name, make_config, tmp_path):
    overrides = [f"env={env_name}", "total_steps=4096", "eval.every_steps=2048", "algo.update_epochs=2",
                 "algo.num_minibatches=8", *QUIET]
    for name in ("a", "b"):
        train(make_config(overrides), tmp_path / name)
    for log in ("train.csv", "eval.csv", "episodes.csv"):
        pd.testing.assert_frame_equal(numbers(tmp_path / "a", log), numbers(tmp_path / "b", log))
    other_seed = make_config(overrides + ["seed=1"])
    train(other_seed, tmp_path / "c")
    assert not numbers(tmp_path / "a", "train.csv").equals(numbers(tmp_path / "c", "train.csv"))


def test_reset_rows_never_reach_the_loss(make_config):
    """Poison every reset row with NaN: the flattened batch and the update stay finite and unchanged."""
    cfg = make_config(["env=CartPole", "env.hparams.num_minibatches=4"]).algo  # 4 minibatches of the 11 valid rows
    torch.manual_seed(0)
    rollout = Rollout.allocate(num_steps=6, num_envs=2, obs_dim=4, action_shape=())
    rollout.obs.normal_()
    rollout.rewards.fill_(1.0)
    rollout.terminated[1, 0] = True
    rollout.valid[2, 0] = False  # reset step after the termination
    results = []
    for poison in (0.0, float("nan")):
        for field in (rollout.obs, rollout.rewards, rollout.values, rollout.log_probs):
            field[2, 0] = poison
        torch.manual_seed(1)
        algo = PPO(4, 2, True, cfg, num_iterations=10)
        batch = algo.flatten_rollout(rollout)
        assert batch["obs"].shape[0] == 11  # 12 rows - 1 reset row
        assert all(torch.isfinite(v).all() for v in batch.values())
        stats = algo.update(rollout, iteration=1)
        results.append((stats, [p.detach().clone() for p in algo.policy.parameters()]))
    assert all(torch.isfinite(torch.tensor(list(results[1][0].values()))))
    for before, after in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(before, after, rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["compiled", "torch"])
def test_trainer_marks_the_step_after_an_episode_end_as_a_reset_row(backend, make_config, tmp_path, monkeypatch):
    from conftest import before_each_update

    seen = []
    before_each_update(monkeypatch, lambda algorithm, rollout, iteration: seen.append(
        {k: getattr(rollout, k).clone() for k in ("valid", "terminated", "truncated", "raw_rewards")}))
    train(make_config(["env=CartPole", f"algo.backend={backend}", "total_steps=1024", *QUIET]), tmp_path)
    for rows in seen:
        ended = rows["terminated"] | rows["truncated"]
        # row t+1 is a reset row exactly when row t ended an episode
        assert torch.equal(~rows["valid"][1:], ended[:-1])
        assert torch.all(rows["raw_rewards"][~rows["valid"]] == 0)
    assert sum(int((~r["valid"]).sum()) for r in seen) > 10  # CartPole episodes are short: plenty of resets


@pytest.mark.slow
def test_ppo_learns_cartpole(make_config, compiled, tmp_path):
    """Fixed seed, loose bound: a broken PPO stays near the random policy's ~20."""
    cfg = make_config(["env=CartPole", "total_steps=40960", "eval.every_steps=40960", "eval.episodes=10",
                       "logging.tensorboard=false", "logging.progress_bar=false"])
    summary = train(cfg, tmp_path)
    assert summary["final_eval_return_mean"] >= 150


@pytest.mark.parametrize("env_name", ["CartPole", "Pendulum"])
def test_checkpoint_alone_reproduces_the_final_evaluation(env_name, make_config, tmp_path, capsys, monkeypatch):
    from benchmarks.evaluate import load_agent
    from benchmarks.engine.trainer import Evaluator

    cfg = make_config([f"env={env_name}", "total_steps=4096", "eval.every_steps=1000000", "eval.episodes=3",
                       "algo.update_epochs=1", "logging.tensorboard=false", "logging.progress_bar=false",
                       "eval.at_start=false"])
    summary = train(cfg, tmp_path)  # evaluates once, at the end, with eval seed = seed + 1_000_000
    algorithm, obs_normalizer, loaded_cfg = load_agent(tmp_path / "checkpoint.pt")
    returns = Evaluator(loaded_cfg.env.id, 3, cfg.seed + 1_000_000)(algorithm, obs_normalizer)
    assert returns.mean() == summary["final_eval_return_mean"]
    if env_name == "CartPole":  # the command, given the run directory: its checkpoint.pt, the same episodes
        result = run_python([sys.executable, "-m", "benchmarks.evaluate", str(tmp_path), "--episodes", "3",
                                 "--seed", str(cfg.seed + 1_000_000)], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
        assert result.stdout.startswith(f"ppo on CartPole-v1: deterministic return {returns.mean():.2f} +- "), result
        stored = torch.load(tmp_path / "checkpoint.pt", weights_only=True)  # one bit flipped on disk
        stored["payload"] = bytes([stored["payload"][0] ^ 1]) + stored["payload"][1:]
        torch.save(stored, tmp_path / "damaged.pt")
        from benchmarks.evaluate import main as evaluate_main

        with pytest.raises(SystemExit) as refused:
            evaluate_main([str(tmp_path / "damaged.pt")])
        assert refused.value.code == 2 and capsys.readouterr().err.endswith(
            f"error: argument checkpoint: {tmp_path / 'damaged.pt'}: its bytes do not match their SHA-256 digest "
            f"(damaged on disk)\n")
        from benchmarks.engine.trainer import EpisodeNeverEnds

        def never_ends(evaluator, algorithm, obs_normalizer):
            raise EpisodeNeverEnds("evaluation: an episode of env.id=CartPole-v1 has not ended after 500 steps")

        monkeypatch.setattr(Evaluator, "__call__", never_ends)  # the task's own error while evaluating: one line
        with pytest.raises(SystemExit) as failed:
            evaluate_main([str(tmp_path)])
        assert failed.value.code == "error: evaluation: an episode of env.id=CartPole-v1 has not ended after 500 steps"
        capsys.readouterr()
        for seed in ("-1", str(2**32)):  # numpy's and Gymnasium's range, as run.py's seed: one line, not a traceback
            with pytest.raises(SystemExit) as refused:
                evaluate_main([str(tmp_path), "--seed", seed])
            assert refused.value.code == 2 and capsys.readouterr().err.splitlines()[-1] == (
                f"python -m benchmarks.evaluate: error: argument --seed: must be an integer in [0, 4294967295], "
                f"got {seed}")


def test_the_trainer_drives_any_algorithm_through_the_interface_alone(make_config, tmp_path, monkeypatch):
    """An algorithm that is not PPO (a linear softmax policy trained by REINFORCE on the rollout) and knows
    nothing of PPO's internals trains, evaluates, checkpoints and resumes through algorithms/interface.py."""
    import torch

    import algorithms
    from algorithms.interface import Algorithm
    from algorithms.ppo import PPOConfig

    class LinearReinforce(Algorithm):
        Config = PPOConfig  # it is built from the ppo preset, whose keys it declares (and ignores)
        guarded_stats = ("loss",)

        def __init__(self, obs_dim, action_dim, discrete, cfg, num_iterations):
            self.logits = torch.nn.Linear(obs_dim, action_dim)
            self.optimizer = torch.optim.SGD(self.logits.parameters(), lr=0.01)

        def act(self, obs):
            distribution = torch.distributions.Categorical(logits=self.logits(obs))
            action = distribution.sample()
            return action, distribution.log_prob(action), torch.zeros(obs.shape[0])

        def act_deterministic(self, obs):
            return self.logits(obs).argmax(-1)

        def value(self, obs):
            return torch.zeros(obs.shape[0])

        fail_at = None  # an iteration whose update raises: the run stops there, its checkpoints kept

        def update(self, rollout, iteration):
            if iteration == self.fail_at:
                raise RuntimeError("stopped on purpose")
            valid = rollout.valid
            log_prob = torch.distributions.Categorical(logits=self.logits(rollout.obs)).log_prob(rollout.actions)
            loss = -(log_prob * rollout.rewards)[valid].mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            return {"loss": float(loss.detach())}

        def named_parameters(self):
            return self.logits.named_parameters()

        def state_dict(self):
            return {"logits": self.logits.state_dict(), "optimizer": self.optimizer.state_dict()}

        def load_state_dict(self, state):
            self.logits.load_state_dict(state["logits"])
            self.optimizer.load_state_dict(state["optimizer"])

    monkeypatch.setitem(algorithms.ALGORITHMS, "ppo", LinearReinforce)  # the preset's `algorithm: ppo` builds it
    overrides = ["env=CartPole", "total_steps=2048", "eval.every_steps=1024", "logging.checkpoint_every_steps=512",
                 *QUIET]
    assert make_config(overrides).algo.backend == "torch"  # no PPO: by default the eager backend runs its update
    summary = train(make_config(overrides), tmp_path / "run")
    assert summary["status"] == "complete" and summary["env_steps"] == 2048
    train_log = pd.read_csv(tmp_path / "run" / "train.csv")
    assert list(train_log["iteration"]) == [1, 2, 3, 4] and "loss" in train_log.columns
    # stopped in iteration 3, then resumed from its checkpoint: the same numbers as the uninterrupted run
    LinearReinforce.fail_at = 3
    with pytest.raises(RuntimeError, match="stopped on purpose"):
        train(make_config(overrides), tmp_path / "resumed")
    LinearReinforce.fail_at = None
    train(make_config(overrides), tmp_path / "resumed")
    for name in ("train.csv", "eval.csv", "episodes.csv"):
        numbers = [pd.read_csv(tmp_path / run / name).drop(columns=["wall_time", "sps", "rollout_time", "update_time"],
                                                            errors="ignore") for run in ("run", "resumed")]
        pd.testing.assert_frame_equal(*numbers, check_exact=True)
