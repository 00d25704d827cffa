"""Outer-PPO (Tan, Toledo, Ellis, Foerster, Huszar 2024, arXiv:2411.00666), docs/algorithms.md section 3.

PPO seen as two loops. At iteration k the behaviour parameters are theta_k.
  inner loop: an estimate theta*_k of where this rollout pulls the parameters,
              from theta_k (or a biased start), with the inner optimizer
  outer step: g_k = theta_k - theta*_k becomes the .grad of theta_k and an
              outer optimizer steps: theta_{k+1} = OuterOpt(theta_k, g_k)

Two inner loops (algo.inner_loop):
  ppo         PPO's own optimisation of the rollout (PPO.optimize, reused as is):
              epochs x minibatches of the full PPO loss, actor and critic. With
              inner = PPO's Adam and outer = SGD(lr=1, momentum=0) this is PPO:
              theta_{k+1} = theta*_k up to float32 rounding. The paper's variants.
  full_batch  the named preset's loop: inner_epochs steps of the inner
              optimizer, each on the clipped surrogate of the WHOLE batch (no
              value loss, no entropy, no minibatches, no gradient clipping), on
              the actor only; the outer step moves the actor. The critic is fitted
              as PPO fits it (its own Adam at PPO's lr and schedule, epochs x
              minibatches of the value loss, norm-clipped), outside the outer step.

The inner optimizer is self.optimizer, so PPO's checkpoint key "optimizer"
holds it and its state (e.g. Adam moments) carries over iterations as in PPO.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated

import torch

from algorithms.core import make_optimizer, masked_mean, normalize_advantages
from algorithms.population import declaring_class, steps_optimizer
from algorithms.ppo import PPO, Evaluation, Phase, PPOConfig, explained_variance
from algorithms.schema import (
    Before,
    NonNegativeFloat,
    OptimizerConfig,
    OuterOptimizerConfig,
    one_of,
    positive_int,
)


def optimizer_from_config(params, opt_cfg) -> torch.optim.Optimizer:
    """conf/algo `inner_optimizer` / `outer_optimizer` block -> torch optimizer.

    momentum and nesterov are SGD's; for adam/adamw the momentum is betas[0]
    (validation rejects a non-zero momentum on adam/adamw so it is never ignored silently).
    Nesterov with momentum 0 is plain SGD; torch refuses that combination, so it is
    built as plain SGD (a sigma x mu sweep with nesterov on can then include mu = 0).
    """
    nesterov = opt_cfg.nesterov and opt_cfg.momentum > 0
    return make_optimizer(
        params, opt_cfg.type, lr=opt_cfg.lr, momentum=opt_cfg.momentum, nesterov=nesterov,
        betas=tuple(opt_cfg.betas), eps=opt_cfg.eps, weight_decay=opt_cfg.weight_decay,
    )


def flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    norms = float(a.norm() * b.norm())
    return float(a @ b) / norms if norms > 0 else math.nan


def kl_after_before(log_prob_before: torch.Tensor, log_prob_after: torch.Tensor) -> float:
    """KL(pi_after || pi_before) from actions sampled by pi_before (the rollout's).

    With r = pi_after / pi_before, E_before[r log r] is that KL; subtracting
    E_before[r - 1] = 0 keeps the expectation and makes every sample >= 0.
    """
    log_ratio = log_prob_after - log_prob_before
    ratio = log_ratio.exp()
    return float((ratio * log_ratio - (ratio - 1.0)).mean())


@dataclass
class OuterPPOConfig(PPOConfig):
    """algo.* of the Outer-PPO presets (conf/algo/outer_ppo*.yaml), beyond PPO's."""
    inner_loop: Annotated[str, one_of(["ppo", "full_batch"]), Before("ppo")]  # earlier runs: PPO's own inner loop
    # full_batch's steps; unused by the ppo inner loop of the runs before it, which compare equal at the presets' 4
    inner_epochs: Annotated[int, positive_int(), Before(4)]
    inner_optimizer: OptimizerConfig
    outer_optimizer: OuterOptimizerConfig
    bias_coef: NonNegativeFloat
    apply_to: Annotated[str, one_of(["all", "actor"])]


class OuterPPO(PPO):
    Config = OuterPPOConfig
    # Its phases (PPO's inner loop, or the full-batch inner steps and the critic's fit) with Adam or plain SGD run in
    # a population's vectorized program, the outer step around them per seed (begin_update, end_update); another
    # inner optimizer runs seed by seed. Declared per instance in __init__, from the config; this is the default.
    population_update = "per_seed"
    guarded_stats = (*PPO.guarded_stats, "outer_grad_norm")

    @classmethod
    def check_config(cls, algo: dict, rollout_size: int) -> list[str]:
        problems = super().check_config(algo, rollout_size)
        outer = algo["outer_optimizer"]
        if outer.get("sigma_eff") is not None and outer["lr"] != 1.0:
            problems.append(f"algo.outer_optimizer.lr must be 1.0 when algo.outer_optimizer.sigma_eff is set (every "
                            f"outer step is rescaled to sigma_eff * |g|, so the lr would have no effect), "
                            f"got {outer['lr']}")
        if algo["inner_loop"] == "full_batch" and algo["target_kl"] is not None:
            problems.append(f"algo.target_kl must be null with algo.inner_loop=full_batch (got {algo['target_kl']}): it "
                            f"stops PPO's epochs, and the full-batch inner loop runs none (algo.inner_loop=ppo does)")
        return problems

    def __init__(self, obs_dim: int, action_dim: int, discrete: bool, cfg, num_iterations: int,
                 network: dict | None = None):
        super().__init__(obs_dim, action_dim, discrete, cfg, num_iterations, network)  # policy + inner optimizer
        # The behaviour parameters the outer step applies to; the others (the critic
        # when apply_to=actor) simply keep theta*_k from the inner loop.
        if self.cfg.apply_to == "actor" or self.full_batch:
            self.outer_params = self.policy.actor_parameters()
        else:
            self.outer_params = list(self.policy.parameters())
        self.outer_optimizer = optimizer_from_config(self.outer_params, self.cfg.outer_optimizer)
        # full_batch: the critic is no part of the outer loop; PPO's optimizer (Adam, eps 1e-5) fits it.
        self.critic_optimizer = (
            make_optimizer(list(self.policy.critic.parameters()), "adam", lr=self.cfg.lr, eps=self.cfg.adam_eps)
            if self.full_batch else None
        )
        # g_{k-1} for the cosine diagnostic, theta_k - theta_{k-1} for the biased start; None before iteration 1.
        self.previous_outer_grad: list[torch.Tensor] | None = None
        self.previous_outer_update: list[torch.Tensor] | None = None
        self.outer_start: tuple | None = None  # (theta_k, log-probabilities before), between the two hooks
        if declaring_class(type(self)) is OuterPPO and all(
                steps_optimizer(getattr(self, phase.optimizer)) for phase in self.update_phases()):
            self.population_update = "vectorized"  # its phases with Adam or plain SGD (a subclass says its own)

    # -- construction -------------------------------------------------------

    @property
    def full_batch(self) -> bool:
        return self.cfg.inner_loop == "full_batch"

    def build_optimizer(self) -> torch.optim.Optimizer:
        """The inner optimizer: over all parameters for PPO's inner loop, over the actor for full_batch."""
        if self.full_batch:
            return optimizer_from_config(self.policy.actor_parameters(), self.cfg.inner_optimizer)
        return optimizer_from_config(self.trained_parameters(), self.cfg.inner_optimizer)

    @property
    def inner_optimizer(self) -> torch.optim.Optimizer:
        return self.optimizer

    # -- learning rates -------------------------------------------------------

    def inner_lr(self, iteration: int) -> float:
        """PPO's schedule (algo.anneal_lr) applied to the inner optimizer's base lr.

        Same formula as PPO's, so an inner lr equal to PPO's is PPO's lr bit for bit
        (the identity test depends on it).
        """
        return self.annealed_lr(iteration, base_lr=self.cfg.inner_optimizer.lr)

    def outer_lr(self, iteration: int) -> float:
        """Constant unless outer_optimizer.anneal_lr: then the same linear decay as PPO's."""
        outer = self.cfg.outer_optimizer
        return self.annealed_lr(iteration, base_lr=outer.lr, anneal=outer.anneal_lr)

    def target_sigma_eff(self, iteration: int) -> float | None:
        """outer_optimizer.sigma_eff on the outer lr's schedule; None when the lr sets the step."""
        outer = self.cfg.outer_optimizer
        if outer.sigma_eff is None:
            return None
        return self.annealed_lr(iteration, base_lr=outer.sigma_eff, anneal=outer.anneal_lr)

    # -- the update -----------------------------------------------------------

    def begin_update(self, rollout, batch, iteration: int) -> float:
        """theta_k, where the outer step starts, and the inner loop's start (theta_k, or the biased start);
        returns the inner loop's lr."""
        self.set_lr(self.outer_optimizer, self.outer_lr(iteration))
        if self.full_batch:
            self.set_lr(self.critic_optimizer, self.annealed_lr(iteration))  # PPO's lr and schedule
        with torch.no_grad():
            theta_k = [p.detach().clone() for p in self.outer_params]
            log_prob_before = self.policy.evaluate_actor(batch["obs"], batch["actions"])[0]  # no critic forward
            if self.cfg.bias_coef > 0 and self.previous_outer_update is not None:
                # Biased start: theta_k + bias_coef * (theta_k - theta_{k-1}); g_k is still measured from theta_k.
                for param, update in zip(self.outer_params, self.previous_outer_update):
                    param.add_(update, alpha=self.cfg.bias_coef)
        self.outer_start = (theta_k, log_prob_before)  # read by end_update, after the inner loop
        return self.inner_lr(iteration)

    def update_phases(self) -> list[Phase]:
        """PPO's inner loop: PPO's phase with the inner optimizer. The named preset's: inner_epochs steps of the inner
        optimizer on the whole batch's clipped surrogate (the actor only, no gradient clip), then the critic fitted
        as PPO fits it (update_epochs x num_minibatches of the value loss, its own Adam, norm-clipped). The critic's
        fit draws each epoch's permutation; the outer step (end_update) moves the actor only, so their order is
        immaterial."""
        if not self.full_batch:
            return super().update_phases()
        return [
            Phase(evaluate="evaluate_actor_minibatch", loss="inner_loss_terms", epochs=self.cfg.inner_epochs,
                  whole_batch=True, logs_loss=False),
            Phase(optimizer="critic_optimizer", evaluate="evaluate_critic_minibatch", loss="critic_loss_terms",
                  epochs=self.cfg.update_epochs, max_grad_norm=self.cfg.max_grad_norm, logs_loss=False),
        ]

    def after_epochs(self, batch) -> dict[str, float]:
        """The full-batch inner loop's critic fit explains the batch's returns this much (PPO's epochs log it)."""
        stats = super().after_epochs(batch)
        if self.full_batch:
            stats["explained_variance"] = explained_variance(batch["values"], batch["returns"])
        return stats

    def evaluate_actor_minibatch(self, minibatch) -> Evaluation:
        """The full-batch inner loop reads the actor only; advantages normalised over the batch (algo.norm_adv)."""
        log_prob, entropy = self.policy.evaluate_actor(minibatch["obs"], minibatch["actions"])
        advantages = minibatch["advantages"]
        if self.cfg.norm_adv:
            advantages = normalize_advantages(advantages, mask=minibatch.get("mask"))
        return Evaluation(log_prob, entropy, None, advantages)

    def inner_loss_terms(self, new: Evaluation, minibatch, stats: dict) -> dict[str, torch.Tensor]:
        """The full-batch loop's inner objective: the clipped surrogate alone (no value loss, no entropy bonus)."""
        stats["entropy"] = masked_mean(new.entropy, minibatch.get("mask")).detach()
        return {"policy": self.policy_term(new, minibatch, stats)}

    def evaluate_critic_minibatch(self, minibatch) -> Evaluation:
        return Evaluation(None, None, self.policy.value(minibatch["obs"]), minibatch["advantages"])

    def critic_loss_terms(self, new: Evaluation, minibatch, stats: dict) -> dict[str, torch.Tensor]:
        """The critic's fit: PPO's value term alone."""
        return {"value": self.value_term(new, minibatch, stats)}

    def end_update(self, batch, iteration: int, stats: dict[str, float]) -> dict[str, float]:
        """The outer step: g_k = theta_k - theta*_k as the .grad of theta_k, one step of the outer optimizer."""
        theta_k, log_prob_before = self.outer_start
        self.outer_start = None
        inner_lr, outer_lr = stats.pop("lr"), self.outer_lr(iteration)
        with torch.no_grad():
            outer_grad = [start - param for start, param in zip(theta_k, self.outer_params)]  # g_k
            for param, start, grad in zip(self.outer_params, theta_k, outer_grad):
                param.copy_(start)  # back to theta_k: the outer step starts there
                param.grad = grad
        self.outer_optimizer.step()
        grad_vector = flat(outer_grad)
        with torch.no_grad():
            for param in self.outer_params:
                param.grad = None  # the next inner loop starts from clean grads
            outer_update = [param.detach() - start for param, start in zip(self.outer_params, theta_k)]
            target = self.target_sigma_eff(iteration)
            if target is not None:
                # The step is linear in the lr (SGD with momentum, Adam, AdamW with decoupled decay alike): scaling
                # it is taking the lr that makes |step| = sigma_eff * |g| this iteration.
                step_norm = float(flat(outer_update).norm())
                scale = target * float(grad_vector.norm()) / step_norm if step_norm > 0 else 0.0
                outer_update = [update * scale for update in outer_update]
                for param, start, update in zip(self.outer_params, theta_k, outer_update):
                    param.copy_(start + update)
                outer_lr = outer_lr * scale  # the lr this iteration's step was taken with
            log_prob_after = self.policy.evaluate_actor(batch["obs"], batch["actions"])[0]

        if self.full_batch:
            stats["critic_lr"] = self.critic_optimizer.param_groups[0]["lr"]

        stats["lr"] = inner_lr
        stats["outer_lr"] = outer_lr
        stats["outer_grad_norm"] = float(grad_vector.norm())
        stats["outer_grad_cosine"] = (
            cosine(grad_vector, flat(self.previous_outer_grad)) if self.previous_outer_grad is not None else math.nan
        )
        stats["outer_step_norm"] = float(flat(outer_update).norm())
        # The effective outer step: 1 is PPO's (theta_{k+1} = theta*_k), 0 a policy that never moves.
        stats["outer_sigma_eff"] = (stats["outer_step_norm"] / stats["outer_grad_norm"]
                                    if stats["outer_grad_norm"] > 0 else math.nan)
        stats["outer_kl"] = kl_after_before(log_prob_before, log_prob_after)
        self.previous_outer_grad = outer_grad
        self.previous_outer_update = outer_update
        return stats

    # -- checkpoints ----------------------------------------------------------

    def state_dict(self) -> dict:
        state = super().state_dict()  # policy + inner optimizer (key "optimizer")
        state["outer_optimizer"] = self.outer_optimizer.state_dict()
        if self.critic_optimizer is not None:
            state["critic_optimizer"] = self.critic_optimizer.state_dict()
        state["previous_outer_grad"] = self.previous_outer_grad
        state["previous_outer_update"] = self.previous_outer_update
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.outer_optimizer.load_state_dict(state["outer_optimizer"])
        if self.critic_optimizer is not None:
            self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.previous_outer_grad = clone_list(state["previous_outer_grad"])
        self.previous_outer_update = clone_list(state["previous_outer_update"])


def clone_list(tensors: list[torch.Tensor] | None) -> list[torch.Tensor] | None:
    # Copies, so the loaded agent never shares buffers with the state it came from.
    return None if tensors is None else [t.detach().clone() for t in tensors]
