"""Many seeds of one configuration trained in lockstep in one process (`seeds=[0,1,...]`, docs/scaling.md).

What is batched, and why: a seed's step costs little arithmetic (64x64 networks) and much
per-call overhead, so N seeds sharing one call per operation cost far less than N
processes. Every seed keeps its own algorithm object (PPO, Outer-PPO, HP3O: own networks,
optimizers, buffers), its own random stream and its own normalisation statistics; what
they share is memory and calls:

- parameters: each seed's flat parameter (algorithms/numpy_backend.py) is row i of one
  [seeds, parameters] array, and its gradient row i of another; layer weights are then
  also [seeds, out, in] views of those arrays;
- acting: one batched forward over all seeds ([seeds, envs, obs] @ [seeds, in, out]),
  each seed's noise drawn from its own torch generator, in the order a single-seed run
  draws it from the global one;
- PPO's update (algo.algorithm=ppo): the epoch x minibatch loop runs once for all seeds,
  each seed shuffling its own valid samples with its own generator; minibatches are
  padded to the largest seed's size and masked, so every mean is over the seed's own
  rows; the loss, gradient and norm clip are the numpy backend's, with a leading seed
  axis; one Adam over the [seeds, parameters] array (elementwise: each seed's own Adam,
  its state copied into the seed's optimizer for checkpoints).
- Outer-PPO and HP3O: their update runs seed by seed (their own code, unchanged), with
  the global random state swapped to the seed's own around it.

Seed i of a batch therefore sees the random draws, env states and statistics seed i sees
alone; what differs is float rounding (batched matrix products and padded sums round
differently), as between the numpy and torch backends. tests/test_batched.py holds the
first update of each seed to a single-seed run's. The rounding also depends on the batch:
the one Adam steps the [seeds, parameters] array's last (size mod vector width) elements,
the last seed's last parameters, in scalar code - so benchmarks.reproduce retrains a seed
in the batch it trained in.
"""

from __future__ import annotations

import random

import numpy as np
import torch
from torch import nn

from algorithms.core import LOG_SQRT_2PI, Rollout, compute_gae, make_optimizer
from algorithms.numpy_backend import inside, log_softmax, min_branch_weight
from algorithms.ppo import PPO, LOSS_KEYS, explained_variance


def batched_mlp_forward(layers, x: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """numpy_backend.mlp_forward with a leading seed axis: x [seeds, rows, in], weights [seeds, out, in]."""
    inputs = []
    for weight, bias in layers[:-1]:
        inputs.append(x)
        x = np.matmul(x, weight.transpose(0, 2, 1))
        x += bias[:, None, :]  # in place: the same float32 sums as tanh(x @ w + b), without temporaries
        np.tanh(x, out=x)
    inputs.append(x)
    weight, bias = layers[-1]
    return np.matmul(x, weight.transpose(0, 2, 1)) + bias[:, None, :], inputs


def batched_mlp_backward(layers, inputs: list[np.ndarray], d_out: np.ndarray, grads) -> None:
    """numpy_backend.mlp_backward with a leading seed axis; padded rows carry a zero d_out."""
    d_pre = d_out
    for index in reversed(range(len(layers))):
        layer_input = inputs[index]
        np.matmul(d_pre.transpose(0, 2, 1), layer_input, out=grads[index][0])
        np.sum(d_pre, axis=1, out=grads[index][1])
        if index > 0:
            tanh_derivative = layer_input * layer_input
            np.subtract(1.0, tanh_derivative, out=tanh_derivative)
            d_pre = np.matmul(d_pre, layers[index][0])
            d_pre *= tanh_derivative


class RandomState:
    """One seed's random streams: a torch generator for acting and shuffling, plus Python's and numpy's
    global states, swapped in around the seed's own update code (which draws from the global ones)."""

    def __init__(self):
        self.torch = torch.Generator()
        self.torch.set_state(torch.get_rng_state())  # continue where the global stream stands (after network init)
        self.python = random.getstate()
        self.numpy = np.random.get_state()

    def __enter__(self) -> "RandomState":
        self.saved = (torch.get_rng_state(), random.getstate(), np.random.get_state())
        torch.set_rng_state(self.torch.get_state())
        random.setstate(self.python)
        np.random.set_state(self.numpy)
        return self

    def __exit__(self, *exc) -> None:
        self.torch.set_state(torch.get_rng_state())
        self.python, self.numpy = random.getstate(), np.random.get_state()
        torch_state, python_state, numpy_state = self.saved
        torch.set_rng_state(torch_state)
        random.setstate(python_state)
        np.random.set_state(numpy_state)


def update_loop_of_its_own(cls) -> bool:
    """Whether a class replaces any of PPO's update loop (what SeedBatch's batched update would skip)."""
    methods = ("update", "optimize", "run_epochs", "minibatch_step", "epoch_batches", "num_minibatches",
               "after_epochs", "begin_update", "end_update", "flatten_rollout", "build_optimizer", "update_phases",
               "run_phase", "phase_epoch_batches", "epoch_minibatches", "phase_step")
    return any(getattr(cls, method) is not getattr(PPO, method) for method in methods)


class SeedBatch:
    """N algorithm objects of one config (numpy backend) whose parameters live in one [N, P] array."""

    def __init__(self, algorithms: list, randoms: list[RandomState]):
        first = algorithms[0].numpy_policy
        if first is None:
            raise ValueError("a seed batch runs on the numpy backend (algo.backend=numpy)")
        self.algorithms, self.randoms = algorithms, randoms
        self.discrete = first.discrete
        count, size = len(algorithms), int(first.offsets[-1])
        self.parameters = torch.zeros(count, size)
        self.grads = torch.zeros(count, size)
        for index, algorithm in enumerate(algorithms):
            algorithm.numpy_policy.bind(self.parameters[index], self.grads[index])
        # [seeds, *shape] views of every parameter and gradient, in NumpyActorCritic's order
        flat, flat_grad = self.parameters.numpy(), self.grads.numpy()
        shapes = [tuple(p.shape) for p in first.parameters]
        spans = list(zip(first.offsets[:-1], first.offsets[1:]))
        views = [flat[:, a:b].reshape(count, *shape) for (a, b), shape in zip(spans, shapes)]
        grad_views = [flat_grad[:, a:b].reshape(count, *shape) for (a, b), shape in zip(spans, shapes)]
        critic_end = 2 * first.num_critic_layers
        actor_end = critic_end + 2 * first.num_actor_layers
        self.critic = list(zip(views[0:critic_end:2], views[1:critic_end:2]))
        self.actor = list(zip(views[critic_end:actor_end:2], views[critic_end + 1:actor_end:2]))
        self.critic_grads = list(zip(grad_views[0:critic_end:2], grad_views[1:critic_end:2]))
        self.actor_grads = list(zip(grad_views[critic_end:actor_end:2], grad_views[critic_end + 1:actor_end:2]))
        self.actor_logstd = None if self.discrete else views[-1]
        self.actor_logstd_grad = None if self.discrete else grad_views[-1]
        # PPO's own update is batched; any other algorithm's runs seed by seed: a class with any update-loop method
        # of its own, or another optimizer than Adam, trains with its own code, never as PPO's Adam.
        self.batched_update = all(a.runs_on_numpy_backend() and not update_loop_of_its_own(type(a))
                                  and type(a.optimizer) is torch.optim.Adam  # its one batched Adam
                                  and a.optimizer.param_groups[0]["weight_decay"] == 0 for a in algorithms)
        if self.batched_update:
            # One Adam over the [seeds, parameters] array: elementwise, so it is every seed's own Adam
            # (same lr schedule and step count in lockstep) in one call. The seeds' own optimizers hold
            # its state only in checkpoints (optimizer_to_seeds / optimizer_from_seeds).
            cfg = algorithms[0].cfg
            self.stacked_parameter = nn.Parameter(self.parameters)
            self.stacked_parameter.grad = self.grads
            self.optimizer = make_optimizer([self.stacked_parameter], "adam", lr=cfg.lr, eps=cfg.adam_eps)

    def __len__(self) -> int:
        return len(self.algorithms)

    # -- acting -----------------------------------------------------------------

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """NumpyActorCritic.act for every seed: obs [seeds, envs, obs_dim] -> action, log_prob, value."""
        head, _ = batched_mlp_forward(self.actor, obs)
        value = batched_mlp_forward(self.critic, obs)[0][..., 0]
        # each seed's draws into its own contiguous slab of one buffer: the numbers torch.randn(shape) /
        # torch.empty(shape).exponential_() give from the seed's generator, without a tensor per seed
        draws = torch.empty(head.shape)  # [seeds, envs, logits or action dims]
        if self.discrete:
            for slab, r in zip(draws, self.randoms):
                slab.exponential_(1, generator=r.torch)
            log_probs = log_softmax(head)
            exponential = draws.numpy()
            action = np.argmax(np.exp(log_probs) / exponential, axis=-1)
            log_prob = np.take_along_axis(log_probs, action[..., None], axis=-1)[..., 0]
            return action, log_prob, value
        for slab, r in zip(draws, self.randoms):
            slab.normal_(generator=r.torch)
        noise = draws.numpy()
        logstd = self.actor_logstd[:, None, :]
        action = head + np.exp(logstd) * noise
        log_prob = (-0.5 * noise * noise - logstd - np.float32(LOG_SQRT_2PI)).sum(-1)
        return action, log_prob, value

    def value(self, obs: np.ndarray) -> np.ndarray:
        """V(obs) of every seed: obs [seeds, envs, obs_dim] -> [seeds, envs]."""
        return batched_mlp_forward(self.critic, obs)[0][..., 0]

    # -- learning -----------------------------------------------------------------

    def update(self, rollouts: list[Rollout], iteration: int, active: list[bool]) -> list[dict | None]:
        """Each active seed's algorithm.update(rollout_i, iteration) stats (None for inactive seeds)."""
        if self.batched_update:
            return self.ppo_update(rollouts, iteration, active)
        stats = []
        for algorithm, rollout, randoms, on in zip(self.algorithms, rollouts, self.randoms, active):
            if not on:
                stats.append(None)
                continue
            with randoms:
                stats.append(algorithm.update(rollout, iteration))
        return stats

    def optimizer_from_seeds(self) -> None:
        """The batch's Adam state from the seeds' own optimizers (after they loaded a checkpoint)."""
        if not self.batched_update:
            return
        states = [a.optimizer.state.get(a.numpy_policy.flat_parameter) for a in self.algorithms]
        self.optimizer.state.clear()
        if all(states):
            self.optimizer.state[self.stacked_parameter] = {
                "step": states[0]["step"].clone(),
                "exp_avg": torch.stack([s["exp_avg"] for s in states]),
                "exp_avg_sq": torch.stack([s["exp_avg_sq"] for s in states])}

    def optimizer_to_seeds(self) -> None:
        """Each seed's optimizer state = its row of the batch's (before its checkpoint is written)."""
        if not self.batched_update or self.stacked_parameter not in self.optimizer.state:
            return
        state = self.optimizer.state[self.stacked_parameter]
        for index, algorithm in enumerate(self.algorithms):
            algorithm.optimizer.state[algorithm.numpy_policy.flat_parameter] = {
                "step": state["step"].clone(), "exp_avg": state["exp_avg"][index].clone(),
                "exp_avg_sq": state["exp_avg_sq"][index].clone()}

    def ppo_update(self, rollouts: list[Rollout], iteration: int, active: list[bool]) -> list[dict | None]:
        """PPO.update for all seeds at once (PPO.optimize -> run_epochs -> minibatch_step, batched)."""
        algorithms = self.algorithms
        cfg = algorithms[0].cfg
        lr = algorithms[0].annealed_lr(iteration)
        # GAE once over all seeds' columns (its recursion is elementwise per column: the same numbers as
        # per seed, at one numpy call per step instead of one per step and seed)
        stacked = {name: torch.cat([getattr(rollout, name) for rollout in rollouts], dim=-1)
                   for name in ("rewards", "values", "next_value", "terminated", "truncated", "valid")}
        advantages, returns = compute_gae(**stacked, gamma=cfg.gamma, gae_lambda=cfg.gae_lambda)
        column = 0
        batches = []
        for algorithm, rollout in zip(algorithms, rollouts):
            algorithm.set_lr(algorithm.optimizer, lr)  # what the seed's checkpoint records
            columns = slice(column, column + rollout.num_envs)
            column += rollout.num_envs
            batches.append(algorithm.flatten_rollout(rollout, (advantages[:, columns], returns[:, columns])))
        algorithms[0].set_lr(self.optimizer, lr)
        # a seed that stopped (non-finite) keeps its parameters: its gradient row is zeroed after each
        # minibatch, and its Adam moments are frozen by restoring them (Adam moves a parameter on zero gradient)
        stopped = [index for index, on in enumerate(active) if not on]
        counts = np.array([batch["obs"].shape[0] for batch in batches])
        largest = int(counts.max())
        num_minibatches = cfg.num_minibatches
        per_minibatch = []  # one dict of [seeds] arrays per minibatch step
        # [seeds, largest batch, ...] buffers; each epoch rewrites every seed's valid rows, padding stays 0
        shuffled = {key: np.zeros((len(self), largest) + tuple(batches[0][key].shape[1:]), np.float32)
                    for key in LOSS_KEYS}
        batch_arrays = [{key: batch[key].numpy() for key in LOSS_KEYS} for batch in batches]
        seed_index = np.arange(len(self))[:, None]
        for _epoch in range(cfg.update_epochs):
            # Each seed shuffles its own samples with its own generator, as PPO.run_epochs does.
            for index, (arrays, randoms) in enumerate(zip(batch_arrays, self.randoms)):
                permutation = torch.randperm(counts[index], generator=randoms.torch).numpy()
                for key in LOSS_KEYS:
                    shuffled[key][index, :counts[index]] = arrays[key][permutation]
            # torch.tensor_split's pieces per seed: the first (n mod M) minibatches hold one more sample.
            sizes = counts[:, None] // num_minibatches + (np.arange(num_minibatches) < counts[:, None] % num_minibatches)
            starts = np.cumsum(sizes, axis=1) - sizes
            width = int(sizes.max())
            for m in range(num_minibatches):
                rows = np.minimum(starts[:, m, None] + np.arange(width), largest - 1)  # [seeds, width]
                mask = (np.arange(width) < sizes[:, m, None]).astype(np.float32)
                minibatch = {key: value[seed_index, rows] for key, value in shuffled.items()}
                stats = self.minibatch_grads(minibatch, mask, cfg)
                self.adam_step(stopped)
                per_minibatch.append(stats)
        # each statistic as [seeds, minibatch steps], then each seed's mean (max for ratio_max) over its row
        per_seed = {key: np.stack([step[key] for step in per_minibatch], axis=1) for key in per_minibatch[0]}
        per_seed = {key: value.max(axis=1) if key == "ratio_max" else value.mean(axis=1)
                    for key, value in per_seed.items()}
        results = []
        for index, (batch, on) in enumerate(zip(batches, active)):
            if not on:
                results.append(None)
                continue
            stats = {key: float(value[index]) for key, value in per_seed.items()}
            stats["explained_variance"] = explained_variance(batch["values"], batch["returns"])
            stats["lr"] = lr
            results.append(stats)
        return results

    def adam_step(self, stopped: list[int]) -> None:
        """One Adam step of every seed's row; rows of stopped seeds are left exactly as they were."""
        if not stopped:
            self.optimizer.step()
            return
        state = self.optimizer.state.get(self.stacked_parameter, {})
        kept = {name: state[name][stopped].clone() for name in ("exp_avg", "exp_avg_sq") if name in state}
        parameters = self.parameters[stopped].clone()
        self.optimizer.step()
        self.parameters[stopped] = parameters
        for name, rows in kept.items():
            self.optimizer.state[self.stacked_parameter][name][stopped] = rows

    def minibatch_grads(self, minibatch: dict[str, np.ndarray], mask: np.ndarray, cfg) -> dict[str, np.ndarray]:
        """NumpyActorCritic.minibatch_grads with a leading seed axis; rows where mask is 0 are padding.

        Every mean is the seed's own: sum over its rows / its row count. Writes the clipped
        gradient into each seed's gradient row; returns each statistic as a [seeds] array.
        """
        obs, actions = minibatch["obs"], minibatch["actions"]
        old_log_prob, old_values = minibatch["log_probs"], minibatch["values"]
        returns, advantages = minibatch["returns"], minibatch["advantages"]
        count = mask.sum(axis=1)  # [seeds]
        weight = mask / np.maximum(count, 1.0)[:, None]  # each row's share of its seed's mean

        head, actor_inputs = batched_mlp_forward(self.actor, obs)
        if self.discrete:
            log_probs = log_softmax(head)
            probs = np.exp(log_probs)
            taken = actions.astype(np.int64)
            new_log_prob = np.take_along_axis(log_probs, taken[..., None], axis=-1)[..., 0]
            entropy = -(probs * log_probs).sum(-1)
        else:
            logstd = self.actor_logstd[:, None, :]
            inv_std = np.exp(-logstd)
            z = (actions - head) * inv_std
            new_log_prob = (-0.5 * z * z - logstd - np.float32(LOG_SQRT_2PI)).sum(-1)
            entropy = np.broadcast_to((0.5 + np.float32(LOG_SQRT_2PI) + logstd).sum(-1), new_log_prob.shape)

        if cfg.norm_adv:  # per minibatch and seed, unbiased std as torch's (a single row is left as it is)
            mean = (advantages * mask).sum(axis=1, keepdims=True) / np.maximum(count, 1.0)[:, None]
            centered = (advantages - mean) * mask
            std = np.sqrt((centered * centered).sum(axis=1, keepdims=True) / np.maximum(count - 1.0, 1.0)[:, None])
            advantages = np.where((count > 1)[:, None], centered / (std + np.float32(1e-8)), advantages)

        clip = cfg.clip_coef
        log_ratio = (new_log_prob - old_log_prob) * mask
        ratio = np.exp(log_ratio)
        clipped_ratio = np.clip(ratio, 1.0 - clip, 1.0 + clip)
        unclipped, clipped = advantages * ratio, advantages * clipped_ratio
        policy_loss = -(np.minimum(unclipped, clipped) * weight).sum(axis=1)
        to_unclipped = min_branch_weight(unclipped, clipped)
        d_ratio = -(to_unclipped + (1.0 - to_unclipped) * inside(ratio, 1.0 - clip, 1.0 + clip)) * advantages * weight
        d_new_log_prob = d_ratio * ratio

        new_values, critic_inputs = batched_mlp_forward(self.critic, obs)
        new_values = new_values[..., 0]
        error = new_values - returns
        if cfg.clip_vloss:
            delta = new_values - old_values
            clipped_error = old_values + np.clip(delta, -clip, clip) - returns
            squared, clipped_squared = error * error, clipped_error * clipped_error
            v_loss = 0.5 * (np.maximum(squared, clipped_squared) * weight).sum(axis=1)
            to_squared = (squared >= clipped_squared).astype(np.float32)
            d_values = (to_squared * error + (1.0 - to_squared) * clipped_error * inside(delta, -clip, clip)) * weight
        else:
            v_loss = 0.5 * (error * error * weight).sum(axis=1)
            d_values = error * weight
        d_values = cfg.vf_coef * d_values

        entropy_mean = (entropy * weight).sum(axis=1)
        loss = policy_loss + cfg.vf_coef * v_loss - cfg.ent_coef * entropy_mean

        if self.discrete:
            d_head = d_new_log_prob[..., None] * (np.eye(head.shape[-1], dtype=np.float32)[taken] - probs)
            d_head += cfg.ent_coef * weight[..., None] * probs * (log_probs + entropy[..., None])
        else:
            d_head = d_new_log_prob[..., None] * z * inv_std
            self.actor_logstd_grad[...] = ((d_new_log_prob[..., None] * (z * z - 1.0)).sum(axis=1)
                                           - np.float32(cfg.ent_coef))
        batched_mlp_backward(self.critic, critic_inputs, d_values[..., None], self.critic_grads)
        batched_mlp_backward(self.actor, actor_inputs, d_head, self.actor_grads)

        # torch.nn.utils.clip_grad_norm_ per seed: scale by min(1, max_norm / (norm + 1e-6))
        flat_grad = self.grads.numpy()
        grad_norm = np.sqrt(np.einsum("ij,ij->i", flat_grad, flat_grad, dtype=np.float64))
        scale = cfg.max_grad_norm / (grad_norm + 1e-6)
        flat_grad *= np.minimum(scale, 1.0).astype(np.float32)[:, None]

        return {
            "loss": loss,
            "policy_loss": policy_loss,
            "value_loss": v_loss,
            "entropy": entropy_mean,
            "approx_kl": (((ratio - 1.0) - log_ratio) * weight).sum(axis=1),
            "clip_fraction": ((np.abs(ratio - 1.0) > clip) * weight).sum(axis=1),
            "grad_norm": grad_norm,
            "ratio_mean": (ratio * weight).sum(axis=1),
            "ratio_max": np.where(mask > 0, ratio, -np.inf).max(axis=1),
        }


def seed_rollout(rollout: Rollout, index: int, num_envs: int) -> Rollout:
    """Seed `index`'s columns of a [steps, seeds x envs] rollout, as views."""
    columns = slice(index * num_envs, (index + 1) * num_envs)
    return Rollout(**{name: getattr(rollout, name)[:, columns] if name != "next_value" else
                      rollout.next_value[columns] for name in Rollout.__dataclass_fields__})
