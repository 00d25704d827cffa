"""Classic PPO (Schulman et al. 2017, arXiv:1707.06347), docs/algorithms.md section 2.

This class implements the trainer's interface (algorithms/interface.py) and is the
shared algorithm core: Outer-PPO, HP3O and PPO-KL subclass it and override only the
part where their paper differs. The pieces a variant replaces, from large to small:
    begin_update / end_update       what surrounds the epochs (Outer-PPO's outer step, HP3O's buffer)
    update_phases()                 the loops of gradient steps (Outer-PPO's full-batch inner loop: two)
    epoch_batches(batch)            the batch each epoch trains on (HP3O draws hybrid batches)
    loss_terms(new, minibatch, stats)  the minibatch loss as named terms, summed in order:
        policy_term                    -clipped surrogate
        value_term                     c_v * value loss
        entropy_term                   -c_e * entropy
    A variant adds a term or replaces one (algorithms/ppo_kl.py does both).
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Annotated, NamedTuple

import torch
from torch import nn

from algorithms.core import (
    Rollout,
    clipped_policy_loss,
    compute_gae,
    make_policy,
    make_optimizer,
    masked_max,
    masked_mean,
    normalize_advantages,
    stepped_parameters,
    value_loss,
)
from algorithms.interface import Algorithm
from algorithms.schema import (
    Before,
    Check,
    Flag,
    Name,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    build_config,
    optional_positive_number,
    positive_int_list,
    unit_interval,
)

Batch = dict[str, torch.Tensor]  # flat samples: obs, actions, log_probs, values, advantages, returns
# What the minibatch loss reads of each sample; the epoch loop shuffles these keys only (HP3O's batches
# carry bookkeeping keys, collected_at and replaced, that no loss reads).
LOSS_KEYS = ("obs", "actions", "log_probs", "values", "advantages", "returns")
# train.csv's columns of a minibatch step, in the order every backend logs them; a variant's own come after.
STEP_STATS = ("loss", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "grad_norm",
              "ratio_mean", "ratio_max")


class Evaluation(NamedTuple):
    """The current policy on a minibatch (PPO.evaluate_minibatch): what the loss terms read."""
    log_prob: torch.Tensor    # log pi(a|s) of the stored actions
    entropy: torch.Tensor     # H(pi(.|s)) per sample
    values: torch.Tensor      # V(s)
    advantages: torch.Tensor  # the stored advantages, normalised per minibatch when algo.norm_adv


class Phase(NamedTuple):
    """One loop of gradient steps within an update, declared by name so that the eager update (PPO.run_phase) and a
    population of seeds (algorithms/population.py) run the same thing. PPO's update is one phase; Outer-PPO's
    full-batch inner loop is two (the actor's inner steps on the whole batch, then the critic's fit)."""
    optimizer: str = "optimizer"          # the attribute holding the torch optimizer: its parameters are what move
    evaluate: str = "evaluate_minibatch"  # method: minibatch -> Evaluation, what the terms read
    loss: str = "loss_terms"              # method: (Evaluation, minibatch, stats) -> named terms, summed in order
    epochs: int | None = None             # None: one per batch of epoch_batches (PPO: update_epochs; HP3O: its own)
    whole_batch: bool = False             # every step on the whole batch, in its order (else shuffled minibatches)
    max_grad_norm: float | None = None    # the global gradient-norm clip over the optimizer's parameters; None: none
    logs_loss: bool = True                # train.csv's "loss": the sum of the terms


@dataclass
class PPOConfig:
    """algo.* of PPO (conf/algo/ppo.yaml); a variant's Config subclasses it with its own keys."""
    name: Name
    algorithm: Name
    hidden_sizes: Annotated[list[int], positive_int_list()]
    lr: PositiveFloat
    anneal_lr: Flag
    adam_eps: PositiveFloat
    gamma: Annotated[float, unit_interval(low_open=True)]
    gae_lambda: Annotated[float, unit_interval()]
    update_epochs: PositiveInt
    num_minibatches: PositiveInt
    clip_coef: PositiveFloat
    clip_vloss: Flag
    norm_adv: Flag
    ent_coef: NonNegativeFloat
    vf_coef: NonNegativeFloat
    max_grad_norm: PositiveFloat
    target_kl: Annotated[float | None, optional_positive_number()]
    # compiled: the loss over a seed axis, compiled (algorithms/population.py; a single seed is a population of
    # one); torch: the same loss in eager autograd, each seed's own code in the same loop (token tasks, and the
    # suites committed on it). Runs that predate the key: torch.
    backend: Annotated[str, Check(lambda v: v in ("compiled", "torch"), "compiled or torch (the numpy backend, a "
                                  "hand-derived gradient of PPO's loss, is retired)"), Before("torch")]


class PPO(Algorithm):
    Config = PPOConfig
    guarded_stats = ("loss", "policy_loss", "value_loss", "entropy", "approx_kl", "grad_norm")
    loss_keys = LOSS_KEYS  # what the epoch loop shuffles into minibatches; a term that reads more declares it here
    # How a population of seeds (algo.backend=compiled, algorithms/population.py) runs this algorithm's update:
    # "vectorized": each of update_phases (PPO: epochs x minibatches of Adam steps on loss_terms) as one compiled
    # program for every seed (a variant that changes only loss terms, loss_inputs, its phases, epoch_batches,
    # after_epochs or what surrounds the epochs - begin_update, end_update - keeps it); "per_seed": the algorithm's
    # own update, seed by seed (a variant that replaces the update loop, or steps another optimizer, says so).
    population_update: str = "vectorized"  # or "per_seed"; a variant may set it per instance, from its config

    @classmethod
    def check_config(cls, algo: dict, rollout_size: int) -> list[str]:
        if rollout_size % algo["num_minibatches"] != 0:
            return [f"algo.num_minibatches must divide the rollout size env.num_envs * env.num_steps = "
                    f"{rollout_size}, got {algo['num_minibatches']}"]
        return []

    def __init__(self, obs_dim: int, action_dim: int, discrete: bool, cfg, num_iterations: int,
                 network: dict | None = None):
        self.cfg = build_config(self.Config, cfg)  # resolved once: the hot loop reads it per minibatch
        self.num_iterations = num_iterations
        self.policy = make_policy(obs_dim, action_dim, discrete, tuple(self.cfg.hidden_sizes), network)
        self.optimizer = self.build_optimizer()

    # -- construction -------------------------------------------------------

    def trained_parameters(self) -> list[nn.Parameter]:
        """What the (inner) optimizer steps: the policy's parameters."""
        return list(self.policy.parameters())

    def build_optimizer(self) -> torch.optim.Optimizer:
        """PPO's optimizer: Adam with eps 1e-5 over actor and critic (PPO detail #3)."""
        return make_optimizer(self.trained_parameters(), "adam", lr=self.cfg.lr, eps=self.cfg.adam_eps)

    # -- acting (called under torch.inference_mode by the trainer) ---------

    def act(self, obs: torch.Tensor):
        return self.policy.act(obs)

    def act_deterministic(self, obs: torch.Tensor) -> torch.Tensor:
        return self.policy.act_deterministic(obs)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.policy.value(obs)

    def named_parameters(self):
        return self.policy.named_parameters()

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
        """One rollout's update: what comes before PPO's epochs, the epochs, what comes after. A variant that
        changes only what surrounds the epochs (Outer-PPO's outer step) overrides the two hooks, and a population
        of seeds runs its epochs vectorized between them (algorithms/population.py)."""
        batch = self.flatten_rollout(rollout)
        lr = learning_rate_from(self, rollout, batch, iteration)
        self.set_lr(self.optimizer, lr)
        stats = self.optimize(batch, self.optimizer)
        stats["lr"] = lr
        return self.end_update(batch, iteration, stats)

    def begin_update(self, rollout: Rollout, batch: Batch, iteration: int) -> float:
        """Before the epochs (PPO: nothing; HP3O: the rollout's episodes into its buffer); returns the epochs'
        learning rate (PPO's annealed lr)."""
        return self.annealed_lr(iteration)

    def end_update(self, batch: Batch, iteration: int, stats: dict[str, float]) -> dict[str, float]:
        """After the epochs and after_epochs (PPO: nothing); returns the statistics train.csv logs."""
        return stats

    def optimize(self, batch: Batch, optimizer: torch.optim.Optimizer) -> dict[str, float]:
        """PPO's inner loop: E epochs over the same rollout batch (docs/algorithms.md section 2); a variant that
        declares other phases (update_phases) runs them in order instead."""
        if self.runs_ppo_epochs():
            stats = self.run_epochs(self.epoch_batches(batch), optimizer)
        else:
            stats = {}
            for phase in self.update_phases():
                stats |= self.run_phase(phase, batch)
        return stats | self.after_epochs(batch)

    def runs_ppo_epochs(self) -> bool:
        """Whether the update's phases are PPO's own one (run by run_epochs: its target-KL stop, its explained
        variance over the epochs' batches)."""
        return self.update_phases() == PPO.update_phases(self)

    def epoch_batches(self, batch: Batch) -> Iterator[Batch]:
        """The batch each epoch trains on, at most update_epochs of them: PPO's is the rollout's, every epoch (HP3O
        draws a hybrid batch per epoch, lazily). A population draws each seed's from the seed's own streams."""
        return (batch for _epoch in range(self.cfg.update_epochs))

    def after_epochs(self, batch: Batch) -> dict[str, float]:
        """What a variant does once the epochs over the batch are done (PPO: nothing; PPO-KL adapts its beta);
        returns statistics for train.csv. The population runs it for each seed after its batched epochs."""
        return {}

    def num_minibatches(self, num_samples: int) -> int:
        """M: PPO splits each epoch's batch into a fixed number of minibatches (HP3O: a fixed size)."""
        return self.cfg.num_minibatches

    def minibatch_rows_at_most(self, rollout_size: int) -> int:
        """The most rows one minibatch can hold: a population pads every minibatch to it (one shape per run).
        PPO's largest piece of a full rollout cut in M; HP3O's minibatch size."""
        return math.ceil(rollout_size / self.num_minibatches(rollout_size))

    def update_phases(self) -> list[Phase]:
        """The loops of gradient steps an update makes, in order. PPO's: one, epochs x shuffled minibatches of
        loss_terms, its Adam over actor and critic, the gradient clipped to max_grad_norm."""
        return [Phase(max_grad_norm=self.cfg.max_grad_norm)]

    def run_epochs(self, epoch_batches: Iterable[Batch], optimizer: torch.optim.Optimizer) -> dict[str, float]:
        """The epoch x shuffled-minibatch loop every algorithm shares: one batch per epoch from `epoch_batches`."""
        tracker = StatsTracker()
        values, returns = [], []
        for batch in epoch_batches:
            for minibatch in self.epoch_minibatches(batch, PPO.update_phases(self)[0]):
                tracker.add(self.minibatch_step(minibatch, optimizer))
            values.append(batch["values"])
            returns.append(batch["returns"])
            if self.cfg.target_kl is not None and tracker.last("approx_kl") > self.cfg.target_kl:
                break  # early stop (PPO detail: target KL), checked once per epoch
        stats = tracker.means()
        stats["explained_variance"] = explained_variance(torch.cat(values), torch.cat(returns))
        return stats

    def run_phase(self, phase: Phase, batch: Batch) -> dict[str, float]:
        """A declared phase of gradient steps on one batch, eagerly; returns its statistics' means. (A phase
        logs no explained variance: a variant that wants it returns it from after_epochs.)"""
        optimizer = getattr(self, phase.optimizer)
        tracker = StatsTracker()
        for epoch_batch in self.phase_epoch_batches(phase, batch):
            for minibatch in self.epoch_minibatches(epoch_batch, phase):
                tracker.add(self.phase_step(phase, minibatch, optimizer))
        optimizer.zero_grad(set_to_none=True)
        return tracker.means()

    def phase_epoch_batches(self, phase: Phase, batch: Batch) -> Iterator[Batch]:
        """The batch each epoch of a phase trains on: epoch_batches's, or the rollout's batch `phase.epochs` times."""
        if phase.epochs is None:
            return iter(self.epoch_batches(batch))
        return (batch for _epoch in range(phase.epochs))

    def epoch_minibatches(self, batch: Batch, phase: Phase) -> list[Batch]:
        """One epoch's minibatches: the whole batch in its order, or a shuffle cut in num_minibatches pieces."""
        if phase.whole_batch:
            return [{key: batch[key] for key in self.loss_keys}]
        num_samples = batch["obs"].shape[0]
        # One gather per epoch; minibatches are then contiguous views of the shuffled batch.
        permutation = torch.randperm(num_samples)
        shuffled = {key: batch[key][permutation] for key in self.loss_keys}
        return split_minibatches(shuffled, self.num_minibatches(num_samples))

    def minibatch_step(self, minibatch: Batch, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
        """One gradient step on the sum of loss_terms, the actor's and critic's gradient clipped together."""
        return self.phase_step(PPO.update_phases(self)[0], minibatch, optimizer)

    def phase_step(self, phase: Phase, minibatch: Batch, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
        """One gradient step of a phase: its evaluation, its terms summed, backward, the clip, the optimizer's step."""
        stats: dict[str, torch.Tensor] = {}
        loss = sum_terms(self.phase_terms(phase, minibatch, stats))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if phase.max_grad_norm is not None:  # PPO detail #11: one norm over every parameter the optimizer steps
            stats["grad_norm"] = nn.utils.clip_grad_norm_(stepped_parameters(optimizer), phase.max_grad_norm).detach()
        optimizer.step()
        if phase.logs_loss:
            stats["loss"] = loss.detach()
        return in_log_order(stats)

    def phase_terms(self, phase: Phase, minibatch: Batch, stats: dict) -> dict[str, torch.Tensor]:
        """A phase's named loss terms on a minibatch: its evaluation, then its terms (each writing into stats)."""
        return getattr(self, phase.loss)(getattr(self, phase.evaluate)(minibatch), minibatch, stats)

    def evaluate_minibatch(self, minibatch: Batch) -> Evaluation:
        """The current policy on the minibatch's stored actions: what every loss term reads."""
        log_prob, entropy, values = self.policy.evaluate(minibatch["obs"], minibatch["actions"])
        advantages = minibatch["advantages"]
        if self.cfg.norm_adv:
            advantages = normalize_advantages(advantages, mask=minibatch.get("mask"))  # per minibatch (PPO detail #7)
        return Evaluation(log_prob, entropy, values, advantages)

    def loss_terms(self, new: Evaluation, minibatch: Batch, stats: dict) -> dict[str, torch.Tensor]:
        """PPO's loss as named terms, summed in this order: -clipped surrogate + c_v * value loss - c_e * entropy.

        Each term writes what it measured into `stats` (train.csv, averaged over the update's minibatches).
        """
        return {
            "policy": self.policy_term(new, minibatch, stats),
            "value": self.value_term(new, minibatch, stats),
            "entropy": self.entropy_term(new, minibatch, stats),
        }

    def policy_term(self, new: Evaluation, minibatch: Batch, stats: dict) -> torch.Tensor:
        """-E[min(r A, clip(r, 1 - eps, 1 + eps) A)], r = pi(a|s) / pi_rollout(a|s) (PPO detail #8)."""
        mask = minibatch.get("mask")  # the population step's padding (algorithms/population.py); None: every row
        pg_loss, ratio, approx_kl, clip_fraction = clipped_policy_loss(
            new.log_prob, minibatch["log_probs"], new.advantages, self.cfg.clip_coef, mask
        )
        stats.update(policy_loss=pg_loss.detach(), approx_kl=approx_kl, clip_fraction=clip_fraction,
                     ratio_mean=masked_mean(ratio, mask), ratio_max=masked_max(ratio, mask))
        return pg_loss

    def value_term(self, new: Evaluation, minibatch: Batch, stats: dict) -> torch.Tensor:
        """c_v * 0.5 * (V - R)^2, clipped around the rollout's values when algo.clip_vloss (PPO detail #9)."""
        v_loss = value_loss(new.values, minibatch["values"], minibatch["returns"],
                            self.cfg.clip_coef if self.cfg.clip_vloss else None, minibatch.get("mask"))
        stats["value_loss"] = v_loss.detach()
        return self.cfg.vf_coef * v_loss

    def entropy_term(self, new: Evaluation, minibatch: Batch, stats: dict) -> torch.Tensor:
        """-c_e * mean entropy: a bonus for exploring (PPO detail #10)."""
        entropy_mean = masked_mean(new.entropy, minibatch.get("mask"))
        stats["entropy"] = entropy_mean.detach()
        return -(self.cfg.ent_coef * entropy_mean)

    # -- per-seed numbers the loss reads (the population step passes them in as tensors) ---------------

    def loss_inputs(self) -> dict[str, float | torch.Tensor]:
        """Numbers or tensors of this seed's own that its loss terms read besides the parameters and the minibatch
        (PPO: none; PPO-KL: its adaptive beta). The population step stacks them over its seeds ([S] for a number,
        as float32; [S, ...] for a tensor, of one shape in every seed)."""
        return {}

    @contextlib.contextmanager
    def bound_loss_inputs(self, inputs: dict[str, torch.Tensor]):
        """While the population step traces the loss: each loss input read as the traced tensor given."""
        saved = {name: getattr(self, name) for name in inputs}
        for name, value in inputs.items():
            setattr(self, name, value)
        try:
            yield
        finally:
            for name, value in saved.items():
                setattr(self, name, value)

    # -- checkpoints ----------------------------------------------------------

    def state_dict(self) -> dict:
        return {"policy": self.policy.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])


class StatsTracker:
    """Collects per-minibatch scalars; averages once at the end."""

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


def in_log_order(stats: dict) -> dict:
    """STEP_STATS first, in their order, then any others in the order they were written."""
    return {**{key: stats[key] for key in STEP_STATS if key in stats}, **stats}


def learning_rate_from(algorithm, rollout: Rollout, batch: Batch, iteration: int) -> float:
    """The algorithm's begin_update, which returns the epochs' learning rate: an override that returns nothing
    (or anything but a number) fails here, naming the method, not inside an optimizer's step."""
    lr = algorithm.begin_update(rollout, batch, iteration)
    if isinstance(lr, bool) or not isinstance(lr, numbers.Real):
        raise TypeError(f"{type(algorithm).__name__}.begin_update returned {lr!r}, not the epochs' learning rate (a "
                        f"number): an override returns it, for instance return super().begin_update(rollout, batch, "
                        f"iteration)")
    return lr


def sum_terms(terms: dict[str, torch.Tensor]) -> torch.Tensor:
    """The loss: the terms added in their order (the first term starts the sum, so PPO's three add up
    to the same float as pg_loss + vf_coef * v_loss - ent_coef * entropy)."""
    values = iter(terms.values())
    total = next(values)
    for term in values:
        total = total + term
    return total


def split_minibatches(batch: Batch, num_minibatches: int) -> list[Batch]:
    """M near-equal contiguous minibatches (sizes differ by at most 1 when reset rows were dropped)."""
    pieces = {key: torch.tensor_split(value, num_minibatches) for key, value in batch.items()}
    return [{key: pieces[key][i] for key in batch} for i in range(num_minibatches)]


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> float:
    var_returns = returns.var()
    if var_returns == 0:
        return float("nan")
    return float(1.0 - (returns - values).var() / var_returns)
