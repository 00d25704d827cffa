"""PPO with the adaptive KL penalty (algorithms/ppo_kl.py): a variant built from PPO's loss terms.

Its loss is PPO's with the "policy" term replaced (no clip) and a "kl_penalty" term added;
beta follows the paper's rule after each update and is part of the checkpoint.
"""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from algorithms.ppo import PPO
from algorithms.ppo_kl import PPOKL, adapted_beta
from benchmarks.engine.trainer import train
from benchmarks.engine.validate import ConfigError, validate_config
from tests.conftest import QUIET
from tests.test_outer_ppo import synthetic_rollout


def build(algorithm_class, make_config, *overrides: str, seed: int = 0):
    cfg = make_config(["algo=ppo_kl", "env=CartPole", *overrides])
    validate_config(cfg)
    torch.manual_seed(seed)
    return algorithm_class(4, 2, True, cfg.algo, 10)


@pytest.mark.parametrize("kl, expected", [
    (0.001, 0.5),            # far below target / 1.5: halved
    (0.01 / 1.5 - 1e-9, 0.5),
    (0.01 / 1.5 + 1e-9, 1.0),  # inside [target / 1.5, target * 1.5]: kept
    (0.01, 1.0),
    (0.015 - 1e-9, 1.0),
    (0.015 + 1e-9, 2.0),     # above target * 1.5: doubled
])
def test_beta_follows_the_papers_rule(kl, expected):
    assert adapted_beta(1.0, kl, target=0.01, tolerance=1.5, factor=2.0) == expected


def test_the_loss_is_ppos_terms_with_the_policy_term_replaced_and_a_kl_penalty_added(make_config):
    algorithm = build(PPOKL, make_config)
    algorithm.kl_beta = 0.7
    batch = algorithm.flatten_rollout(synthetic_rollout(algorithm, obs_dim=4))
    with torch.no_grad():  # move the policy so that the ratio is not 1
        for parameter in algorithm.policy.actor.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    new = algorithm.evaluate_minibatch(batch)
    stats: dict = {}
    terms = algorithm.loss_terms(new, batch, stats)
    assert list(terms) == ["policy", "value", "entropy", "kl_penalty"]

    log_ratio = new.log_prob - batch["log_probs"]
    ratio = log_ratio.exp()
    torch.testing.assert_close(terms["policy"], -(ratio * new.advantages).mean(), rtol=0, atol=0)
    torch.testing.assert_close(terms["kl_penalty"], 0.7 * (ratio - 1 - log_ratio).mean(), rtol=0, atol=0)
    # value and entropy are PPO's own terms, untouched
    ppo_terms = PPO.loss_terms(algorithm, new, batch, {})
    for name in ("value", "entropy"):
        torch.testing.assert_close(terms[name], ppo_terms[name], rtol=0, atol=0)
    assert float(terms["kl_penalty"].detach()) > 0 and stats["kl_penalty"] == terms["kl_penalty"].detach()


def test_without_penalty_and_with_a_clip_that_never_binds_it_takes_ppos_exact_update(make_config):
    """beta 0 and clip 1e6: unclipped surrogate = PPO's clipped one, so both update to the same bits."""
    wide = ["algo.clip_coef=1000000.0", "algo.clip_vloss=false"]
    ppo, kl = build(PPO, make_config, *wide), build(PPOKL, make_config, *wide)
    kl.kl_beta = 0.0
    torch.manual_seed(1)
    rollout = synthetic_rollout(ppo, obs_dim=4)
    for algorithm in (ppo, kl):
        torch.manual_seed(2)  # the same minibatch permutations
        algorithm.update(rollout, iteration=1)
    for a, b in zip(ppo.policy.parameters(), kl.policy.parameters()):
        assert torch.equal(a, b)


@pytest.mark.slow
def test_beta_adapts_in_training_and_survives_a_checkpoint(make_config, tmp_path):
    cfg = make_config(["algo=ppo_kl", "env=CartPole", "total_steps=4096", *QUIET])
    train(cfg, tmp_path / "run")
    log = pd.read_csv(tmp_path / "run" / "train.csv")
    assert log["kl_beta"].iloc[0] == 1.0 and log["kl_beta"].nunique() > 1  # the paper's rule moved it
    for step, row in log.iloc[:-1].iterrows():  # each update's beta follows from the previous update's KL
        assert log["kl_beta"].iloc[step + 1] == adapted_beta(row["kl_beta"], row["update_kl"], 0.01, 1.5, 2.0)

    algorithm = build(PPOKL, make_config)
    algorithm.kl_beta = 0.125
    restored = build(PPOKL, make_config, seed=1)
    restored.load_state_dict(algorithm.state_dict())
    assert restored.kl_beta == 0.125


@pytest.mark.parametrize("override, message", [
    ("algo.kl_target=0", "algo.kl_target must be a number > 0, got 0"),
    ("algo.kl_tolerance=1.0", "algo.kl_tolerance must be a number in (1, 100), got 1.0"),
    ("algo.kl_factor=inf", "algo.kl_factor must be a number in (1, 100), got inf"),
])
def test_its_own_keys_are_checked_in_one_line(override, message, make_config):
    with pytest.raises(ConfigError) as raised:
        validate_config(make_config(["algo=ppo_kl", "env=CartPole", override]))
    assert str(raised.value) == message


def test_its_keys_are_refused_on_other_algorithms(make_config):
    with pytest.raises(ConfigError, match=r"algo.kl_target is not a key of this config"):
        validate_config(make_config(["algo=ppo", "env=CartPole", "+algo.kl_target=0.01"]))



def test_it_trains_on_the_population_engine_by_default_as_ppo_does(make_config):
    """algo.backend's default: the compiled engine for PPO and every variant; a task family's own backend wins
    (token tasks: torch)."""
    assert make_config(["algo=ppo_kl", "env=CartPole"]).algo.backend == "compiled"
    assert make_config(["algo=ppo", "env=CartPole"]).algo.backend == "compiled"
    assert make_config(["algo=ppo_kl", "env=RLHFPraise"]).algo.backend == "torch"


def test_a_tool_that_composes_a_config_alone_resolves_its_default_backend():
    """compose_config in a fresh process (a tool's, not run.py's) registers the resolvers conf/ uses."""
    import subprocess
    import sys
    from pathlib import Path

    code = "from benchmarks.engine.config import compose_config; print(compose_config(['algo=ppo_kl']).algo.backend)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.stdout.strip() == "compiled", done.stderr
