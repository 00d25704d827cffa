"""The contract between the training loop and an algorithm (benchmarks/engine/batch_trainer.py calls only this).

An algorithm is built once per run from its preset (conf/algo/<preset>.yaml):

    Algorithm(obs_dim, action_dim, discrete, cfg, num_iterations, network=None)

(network: the task's policy network, env.network; None is the MLP of algo.hidden_sizes, and
algorithms/core.make_policy builds either, the causal language model of token tasks included)

and then driven by the loop: act on every env step, value to bootstrap the last one,
update once per rollout, act_deterministic to evaluate, state_dict/load_state_dict to
checkpoint and resume. What it declares about itself:

    Config         the schema of its algo.* keys: a dataclass whose fields carry each key's
                   type and range (algorithms/schema.py); a variant's subclasses its
                   parent's, so it lists only its new keys. self.cfg is one, built once.
    check_config   checks of keys that relate to each other or to the rollout size
    guarded_stats  update statistics that must be finite: the trainer stops the run on
                   a non-finite one (the last good checkpoint is kept)
    loss_keys      (PPO and its variants) the per-sample keys the minibatch loss reads

PPO (algorithms/ppo.py) implements every method; each variant subclasses it and
replaces only what its paper changes (docs/extending.md walks through one).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import ClassVar

import torch

from algorithms.core import Rollout


class Algorithm(ABC):
    Config: ClassVar[type]  # a dataclass (algorithms/schema.py)
    guarded_stats: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def check_config(cls, algo: dict, rollout_size: int) -> list[str]:
        """One line per problem among keys that relate (each key's own range is in Config)."""
        return []

    # -- acting (called under torch.inference_mode) --------------------------

    @abstractmethod
    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A stochastic action per env, its log-probability and V(obs) (the rollout's)."""

    @abstractmethod
    def act_deterministic(self, obs: torch.Tensor) -> torch.Tensor:
        """The evaluation action: the distribution's mode."""

    @abstractmethod
    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """V(obs), to bootstrap the step after the rollout."""

    # -- learning ----------------------------------------------------------------

    @abstractmethod
    def update(self, rollout: Rollout, iteration: int) -> dict[str, float]:
        """Learn from one rollout (iteration counts from 1); returns the statistics train.csv logs."""

    @abstractmethod
    def named_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        """Every trained parameter, by name (the trainer checks them for non-finite values)."""

    # -- checkpoints ---------------------------------------------------------------

    @abstractmethod
    def state_dict(self) -> dict:
        """Everything a resumed run needs to take the same next update (networks, optimizers, buffers)."""

    @abstractmethod
    def load_state_dict(self, state: dict) -> None: ...
