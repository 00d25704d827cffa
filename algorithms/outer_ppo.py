"""Outer-PPO (Tan, Toledo, Ellis, Foerster, Huszar 2024, arXiv:2411.00666), spec section 3.

PPO seen as two loops. At iteration k the behaviour parameters are theta_k.
  inner loop: PPO's own optimisation of the rollout (PPO.optimize, reused as is)
              from theta_k (or a biased start), with the inner optimizer -> theta*_k
  outer step: g_k = theta_k - theta*_k becomes the .grad of theta_k and an
              outer optimizer steps: theta_{k+1} = OuterOpt(theta_k, g_k)
With inner = PPO's Adam and outer = SGD(lr=1, momentum=0) this is PPO:
theta_{k+1} = theta_k - (theta_k - theta*_k) = theta*_k up to float32 rounding.

The inner optimizer is self.optimizer, so PPO's checkpoint key "optimizer"
holds it and its state (e.g. Adam moments) carries over iterations as in PPO.
"""

from __future__ import annotations

import math

import torch

from algorithms.core import Rollout, make_optimizer
from algorithms.ppo import PPO


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


class OuterPPO(PPO):
    def __init__(self, obs_dim: int, action_dim: int, discrete: bool, cfg, num_iterations: int):
        super().__init__(obs_dim, action_dim, discrete, cfg, num_iterations)  # policy + inner optimizer
        # The behaviour parameters the outer step applies to; the others (the critic
        # when apply_to=actor) simply keep theta*_k from the inner loop.
        if self.cfg.apply_to == "actor":
            self.outer_params = self.policy.actor_parameters()
        else:
            self.outer_params = list(self.policy.parameters())
        self.outer_optimizer = optimizer_from_config(self.outer_params, self.cfg.outer_optimizer)
        # g_{k-1} for the cosine diagnostic, theta_k - theta_{k-1} for the biased start; None before iteration 1.
        self.previous_outer_grad: list[torch.Tensor] | None = None
        self.previous_outer_update: list[torch.Tensor] | None = None

    # -- construction -------------------------------------------------------

    def build_optimizer(self) -> torch.optim.Optimizer:
        """The inner optimizer, over all parameters (PPO's inner loop trains actor and critic)."""
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

    # -- the update -----------------------------------------------------------

    def update(self, rollout: Rollout, iteration: int) -> dict[str, float]:
        inner_lr, outer_lr = self.inner_lr(iteration), self.outer_lr(iteration)
        self.set_lr(self.inner_optimizer, inner_lr)
        self.set_lr(self.outer_optimizer, outer_lr)
        batch = self.flatten_rollout(rollout)

        with torch.no_grad():
            theta_k = [p.detach().clone() for p in self.outer_params]
            log_prob_before = self.policy.evaluate(batch["obs"], batch["actions"])[0]
            if self.cfg.bias_coef > 0 and self.previous_outer_update is not None:
                # Biased start: theta_k + bias_coef * (theta_k - theta_{k-1}); g_k is still measured from theta_k.
                for param, update in zip(self.outer_params, self.previous_outer_update):
                    param.add_(update, alpha=self.cfg.bias_coef)

        stats = self.optimize(batch, self.inner_optimizer)  # inner loop, PPO's own: -> theta*_k

        with torch.no_grad():
            outer_grad = [start - param for start, param in zip(theta_k, self.outer_params)]  # g_k
            for param, start, grad in zip(self.outer_params, theta_k, outer_grad):
                param.copy_(start)  # back to theta_k: the outer step starts there
                param.grad = grad
        self.outer_optimizer.step()
        with torch.no_grad():
            for param in self.outer_params:
                param.grad = None  # the next inner loop starts from clean grads
            outer_update = [param.detach() - start for param, start in zip(self.outer_params, theta_k)]
            log_prob_after = self.policy.evaluate(batch["obs"], batch["actions"])[0]

        grad_vector = flat(outer_grad)
        stats["lr"] = inner_lr
        stats["outer_lr"] = outer_lr
        stats["outer_grad_norm"] = float(grad_vector.norm())
        stats["outer_grad_cosine"] = (
            cosine(grad_vector, flat(self.previous_outer_grad)) if self.previous_outer_grad is not None else math.nan
        )
        stats["outer_step_norm"] = float(flat(outer_update).norm())
        stats["outer_kl"] = kl_after_before(log_prob_before, log_prob_after)
        self.previous_outer_grad = outer_grad
        self.previous_outer_update = outer_update
        return stats

    # -- checkpoints ----------------------------------------------------------

    def state_dict(self) -> dict:
        state = super().state_dict()  # policy + inner optimizer (key "optimizer")
        state["outer_optimizer"] = self.outer_optimizer.state_dict()
        state["previous_outer_grad"] = self.previous_outer_grad
        state["previous_outer_update"] = self.previous_outer_update
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.outer_optimizer.load_state_dict(state["outer_optimizer"])
        self.previous_outer_grad = clone_list(state["previous_outer_grad"])
        self.previous_outer_update = clone_list(state["previous_outer_update"])


def clone_list(tensors: list[torch.Tensor] | None) -> list[torch.Tensor] | None:
    # Copies, so the loaded agent never shares buffers with the state it came from.
    return None if tensors is None else [t.detach().clone() for t in tensors]
