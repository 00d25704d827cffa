"""Classic PPO (Schulman et al. 2017, arXiv:1707.06347), docs/algorithms.md section 2.

This class is also the shared algorithm core: Outer-PPO and HP3O subclass it
and override only the part where their paper differs (the update).
The trainer drives every algorithm through the same four calls:
    act(obs) -> action, log_prob, value     (stochastic, rollout)
    act_deterministic(obs) -> action        (evaluation)
    value(obs) -> V(obs)                    (bootstrap)
    update(rollout, iteration) -> stats     (learning)
plus state_dict / load_state_dict for checkpoints.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from algorithms.core import (
    ActorCritic,
    Rollout,
    clipped_policy_loss,
    compute_gae,
    make_optimizer,
    normalize_advantages,
    plain_config,
    value_loss,
)
from algorithms.numpy_backend import NumpyActorCritic

Batch = dict[str, torch.Tensor]  # flat samples: obs, actions, log_probs, values, advantages, returns
LOSS_KEYS = ("obs", "actions", "log_probs", "values", "advantages", "returns")  # what minibatch_step reads


class PPO:
    def __init__(self, obs_dim: int, action_dim: int, discrete: bool, cfg, num_iterations: int):
        self.cfg = plain_config(cfg)  # resolved once: the hot loop reads it per minibatch
        self.num_iterations = num_iterations
        self.policy = ActorCritic(obs_dim, action_dim, discrete, tuple(cfg.hidden_sizes))
        # algo.backend=numpy: acting and the minibatch step in numpy on views of the same parameters
        # (algorithms/numpy_backend.py); evaluation, values and the optimizers stay torch.
        if self.cfg.backend == "numpy" and type(self).minibatch_step is not PPO.minibatch_step:
            # the numpy gradient is PPO's loss's; a changed loss would step on a gradient it never wrote
            raise ValueError(f"algo.backend=numpy cannot run {type(self).__name__}: it overrides minibatch_step")
        self.numpy_policy = NumpyActorCritic(self.policy) if self.cfg.backend == "numpy" else None
        self.optimizer = self.build_optimizer()

    # -- construction -------------------------------------------------------

    def trained_parameters(self) -> list[nn.Parameter]:
        """What the (inner) optimizer steps: the policy's parameters, or their one flat tensor on the numpy backend."""
        if self.numpy_policy is not None:
            return [self.numpy_policy.flat_parameter]
        return list(self.policy.parameters())

    def build_optimizer(self) -> torch.optim.Optimizer:
        """PPO's optimizer: Adam with eps 1e-5 over actor and critic (PPO detail #3)."""
        return make_optimizer(self.trained_parameters(), "adam", lr=self.cfg.lr, eps=self.cfg.adam_eps)

    # -- acting (called under torch.inference_mode by the trainer) ---------

    def act(self, obs: torch.Tensor):
        if self.numpy_policy is not None:
            return self.numpy_policy.act(obs)
        return self.policy.act(obs)

    def act_deterministic(self, obs: torch.Tensor) -> torch.Tensor:
        return self.policy.act_deterministic(obs)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.policy.value(obs)

    # -- learning -------------------------------------------------------------

    def annealed_lr(self, iteration: int, base_lr: float | None = None, anneal: bool | None = None) -> float:
        """Linear annealing to 0 over the run (PPO detail #4); iteration counts from 1.

        base_lr and anneal default to PPO's own (algo.lr, algo.anneal_lr); Outer-PPO
        passes its inner and outer optimizers' so that all schedules are one formula.
        """
        base_lr = self.cfg.lr if base_lr is None else base_lr
        anneal = self.cfg.anneal_lr if anneal is None else anneal
        if not anneal:
            return base_lr
        return base_lr * (1.0 - (iteration - 1) / self.num_iterations)

    def set_lr(self, optimizer: torch.optim.Optimizer, lr: float) -> None:
        for group in optimizer.param_groups:
            group["lr"] = lr

    def flatten_rollout(self, rollout: Rollout) -> Batch:
        """GAE over the rollout, then keep only valid rows (reset rows never reach a loss)."""
        advantages, returns = compute_gae(
            rollout.rewards, rollout.values, rollout.next_value, rollout.terminated,
            rollout.truncated, rollout.valid, self.cfg.gamma, self.cfg.gae_lambda,
        )
        valid = rollout.valid.reshape(-1)
        obs_dim = rollout.obs.shape[-1]
        action_shape = rollout.actions.shape[2:]
        return {
            "obs": rollout.obs.reshape(-1, obs_dim)[valid],
            "actions": rollout.actions.reshape((-1,) + tuple(action_shape))[valid],
            "log_probs": rollout.log_probs.reshape(-1)[valid],
            "values": rollout.values.reshape(-1)[valid],
            "advantages": advantages.reshape(-1)[valid],
            "returns": returns.reshape(-1)[valid],
        }

    def update(self, rollout: Rollout, iteration: int) -> dict[str, float]:
        lr = self.annealed_lr(iteration)
        self.set_lr(self.optimizer, lr)
        batch = self.flatten_rollout(rollout)
        stats = self.optimize(batch, self.optimizer)
        stats["lr"] = lr
        return stats

    def optimize(self, batch: Batch, optimizer: torch.optim.Optimizer) -> dict[str, float]:
        """PPO's inner loop: E epochs over the same rollout batch (docs/algorithms.md section 2)."""
        return self.run_epochs((batch for _epoch in range(self.cfg.update_epochs)), optimizer)

    def num_minibatches(self, num_samples: int) -> int:
        """M: PPO splits each epoch's batch into a fixed number of minibatches (HP3O: a fixed size)."""
        return self.cfg.num_minibatches

    def run_epochs(self, epoch_batches: Iterable[Batch], optimizer: torch.optim.Optimizer) -> dict[str, float]:
        """The epoch x shuffled-minibatch loop every algorithm shares: one batch per epoch from `epoch_batches`."""
        tracker = StatsTracker()
        values, returns = [], []
        for batch in epoch_batches:
            num_samples = batch["obs"].shape[0]
            # One gather per epoch; minibatches are then contiguous views of the shuffled batch.
            permutation = torch.randperm(num_samples)
            shuffled = {key: batch[key][permutation] for key in LOSS_KEYS}
            for minibatch in split_minibatches(shuffled, self.num_minibatches(num_samples)):
                tracker.add(self.minibatch_step(minibatch, optimizer))
            values.append(batch["values"])
            returns.append(batch["returns"])
            if self.cfg.target_kl is not None and tracker.last("approx_kl") > self.cfg.target_kl:
                break  # early stop (PPO detail: target KL), checked once per epoch
        stats = tracker.means()
        stats["explained_variance"] = explained_variance(torch.cat(values), torch.cat(returns))
        return stats

    def minibatch_step(self, minibatch: Batch, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
        """One gradient step of -clipped surrogate + c_v * value loss - c_e * entropy."""
        if self.numpy_policy is not None:
            return self.numpy_minibatch_step(minibatch, optimizer)
        cfg = self.cfg
        new_log_prob, entropy, new_values = self.policy.evaluate(minibatch["obs"], minibatch["actions"])
        advantages = minibatch["advantages"]
        if cfg.norm_adv:
            advantages = normalize_advantages(advantages)  # per minibatch (PPO detail #7)
        pg_loss, ratio, approx_kl, clip_fraction = clipped_policy_loss(
            new_log_prob, minibatch["log_probs"], advantages, cfg.clip_coef
        )
        v_loss = value_loss(
            new_values, minibatch["values"], minibatch["returns"], cfg.clip_coef if cfg.clip_vloss else None
        )
        entropy_mean = entropy.mean()
        loss = pg_loss + cfg.vf_coef * v_loss - cfg.ent_coef * entropy_mean

        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.max_grad_norm)
        optimizer.step()
        return {
            "loss": loss.detach(),
            "policy_loss": pg_loss.detach(),
            "value_loss": v_loss.detach(),
            "entropy": entropy_mean.detach(),
            "approx_kl": approx_kl,
            "clip_fraction": clip_fraction,
            "grad_norm": grad_norm.detach(),
            "ratio_mean": ratio.mean(),
            "ratio_max": ratio.max(),
        }

    def numpy_minibatch_step(self, minibatch: Batch, optimizer: torch.optim.Optimizer) -> dict[str, float]:
        """minibatch_step with the loss and its gradient computed in numpy; the torch optimizer steps."""
        stats = self.numpy_policy.minibatch_grads(minibatch, self.cfg)  # into flat_parameter.grad
        optimizer.step()
        return stats

    # -- checkpoints ----------------------------------------------------------

    def state_dict(self) -> dict:
        return {"policy": self.policy.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])


class StatsTracker:
    """Collects per-minibatch scalars (tensors, or floats from the numpy backend); averages once at the end."""

    def __init__(self):
        self.values: dict[str, list[torch.Tensor | float]] = {}

    def add(self, stats: dict[str, torch.Tensor]) -> None:
        for key, value in stats.items():
            self.values.setdefault(key, []).append(value)

    def last(self, key: str) -> float:
        return float(self.values[key][-1])

    def means(self) -> dict[str, float]:
        out = {}
        for key, items in self.values.items():
            stacked = torch.stack(items) if isinstance(items[0], torch.Tensor) else torch.tensor(items)
            out[key] = float(stacked.max()) if key == "ratio_max" else float(stacked.mean())
        return out


def split_minibatches(batch: Batch, num_minibatches: int) -> list[Batch]:
    """M near-equal contiguous minibatches (sizes differ by at most 1 when reset rows were dropped)."""
    pieces = {key: torch.tensor_split(value, num_minibatches) for key, value in batch.items()}
    return [{key: pieces[key][i] for key in batch} for i in range(num_minibatches)]


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> float:
    var_returns = returns.var()
    if var_returns == 0:
        return float("nan")
    return float(1.0 - (returns - values).var() / var_returns)
