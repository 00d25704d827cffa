"""PPO with an adaptive KL penalty (Schulman et al. 2017, arXiv:1707.06347, section 4), docs/algorithms.md section 5.

The paper's alternative to clipping: maximise the unclipped surrogate minus a KL penalty,

    L^KLPEN = E[ r A - beta KL[pi_rollout(.|s), pi(.|s)] ],

and after each update adapt beta to the KL the update actually took, d:

    d < kl_target / kl_tolerance:  beta <- beta / kl_factor
    d > kl_target * kl_tolerance:  beta <- beta * kl_factor

(the paper's 1.5 and 2). Everything else is PPO's: value and entropy terms, epochs x
minibatches, Adam, gradient clipping. In the loss's terms (PPO.loss_terms): the
"policy" term is replaced (no clip) and a "kl_penalty" term is added.

Choices made here:
- The KL is estimated from the rollout's actions, per sample, with the estimator the
  logs already report as approx_kl: (r - 1) - log r, r = pi(a|s) / pi_rollout(a|s).
  Its mean is KL[pi_rollout, pi] and its gradient the KL's gradient, in expectation;
  it needs no stored distribution parameters, so discrete and Gaussian policies share it.
- d is measured once per update on the whole rollout batch after the last epoch (the
  paper: "compute d" after the update), and the new beta applies from the next update.
- The first update uses kl_beta_init (the paper: the initial value matters little,
  because beta adapts quickly).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import torch

from algorithms.core import masked_max, masked_mean
from algorithms.ppo import PPO, Batch, Evaluation, PPOConfig
from algorithms.schema import PositiveFloat, number_between


@dataclass
class PPOKLConfig(PPOConfig):
    """algo.* of ppo_kl (conf/algo/ppo_kl.yaml), beyond PPO's."""
    kl_target: PositiveFloat                                # d_targ; the paper tries 0.003, 0.01, 0.03
    kl_beta_init: PositiveFloat                             # beta before the first update
    kl_tolerance: Annotated[float, number_between(1, 100)]  # adapt when d leaves [target / tol, target * tol]
    kl_factor: Annotated[float, number_between(1, 100)]     # beta is multiplied or divided by it


class PPOKL(PPO):
    Config = PPOKLConfig
    guarded_stats = (*PPO.guarded_stats, "kl_beta", "kl_penalty")

    def __init__(self, obs_dim: int, action_dim: int, discrete: bool, cfg, num_iterations: int,
                 network: dict | None = None):
        super().__init__(obs_dim, action_dim, discrete, cfg, num_iterations, network)
        self.kl_beta = float(self.cfg.kl_beta_init)

    # -- the loss: one term replaced, one added ----------------------------------

    def policy_term(self, new: Evaluation, minibatch: Batch, stats: dict) -> torch.Tensor:
        """Replaced: -E[r A], the surrogate without PPO's clip."""
        mask = minibatch.get("mask")
        log_ratio = new.log_prob - minibatch["log_probs"]
        ratio = log_ratio.exp()
        surrogate_loss = -masked_mean(ratio * new.advantages, mask)
        detached = ratio.detach()
        stats.update(policy_loss=surrogate_loss.detach(), approx_kl=sample_kl(log_ratio.detach(), mask),
                     clip_fraction=masked_mean(((detached - 1.0).abs() > self.cfg.clip_coef).float(), mask),
                     ratio_mean=masked_mean(detached, mask), ratio_max=masked_max(detached, mask))  # for comparison
        return surrogate_loss

    def loss_terms(self, new: Evaluation, minibatch: Batch, stats: dict) -> dict[str, torch.Tensor]:
        terms = super().loss_terms(new, minibatch, stats)
        terms["kl_penalty"] = self.kl_penalty_term(new, minibatch, stats)  # added
        return terms

    def kl_penalty_term(self, new: Evaluation, minibatch: Batch, stats: dict) -> torch.Tensor:
        """beta * KL[pi_rollout, pi], estimated per sample as (r - 1) - log r."""
        kl = sample_kl(new.log_prob - minibatch["log_probs"], minibatch.get("mask"))
        stats["kl_penalty"] = (self.kl_beta * kl).detach()
        return self.kl_beta * kl

    # -- beta adapts after each update ---------------------------------------------

    def after_epochs(self, batch: Batch) -> dict[str, float]:
        stats = {"kl_beta": self.kl_beta}  # the beta this update used
        with torch.no_grad():
            log_ratio = self.policy.evaluate_actor(batch["obs"], batch["actions"])[0] - batch["log_probs"]
            update_kl = float(sample_kl(log_ratio))
        stats["update_kl"] = update_kl
        self.kl_beta = adapted_beta(self.kl_beta, update_kl, self.cfg.kl_target, self.cfg.kl_tolerance,
                                    self.cfg.kl_factor)
        return stats

    def loss_inputs(self) -> dict[str, float]:
        return {"kl_beta": self.kl_beta}  # each seed adapts its own beta

    def state_dict(self) -> dict:
        return {**super().state_dict(), "kl_beta": self.kl_beta}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.kl_beta = state["kl_beta"]


def sample_kl(log_ratio: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """KL[pi_rollout, pi] estimated from the rollout's actions: mean of (r - 1) - log r, r = exp(log_ratio)."""
    return masked_mean(log_ratio.exp() - 1.0 - log_ratio, mask)


def adapted_beta(beta: float, kl: float, target: float, tolerance: float, factor: float) -> float:
    """The paper's rule: halve beta when the update moved too little, double it when too much."""
    if kl < target / tolerance:
        return beta / factor
    if kl > target * tolerance:
        return beta * factor
    return beta
