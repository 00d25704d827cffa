"""PPO's hot path in numpy: acting, and one minibatch's loss with its hand-derived gradient.

`algo.backend=numpy`, the default where an algorithm keeps PPO's loss (`algo.backend=torch`: autograd;
`compiled`: autograd over a seed axis, compiled). Why it exists: the networks
are tiny (64x64 MLPs), so at a batch of 1 (acting) or 64 (a minibatch) the
time goes to per-operation overhead, not arithmetic: torch's dispatch and
autograd bookkeeping cost more per call than numpy's. On HalfCheetah the
minibatch loss and gradient take 1.6 s of a 40960-step run here against 8.7 s
with torch autograd (`python -m benchmarks.speed.profile`, docs/performance.md).

What stays the same:
- the math: every term of ActorCritic.act/evaluate and PPO.minibatch_step
  (core.py, ppo.py) is written out below with its derivative; tests check the
  loss, every gradient and every statistic against torch autograd to float32
  rounding (tests/test_numpy_backend.py);
- the random stream: action noise and categorical samples are still drawn from
  torch's generator, consuming it exactly as the torch backend does;
- the parameters and the optimizer: the policy's torch parameters become views
  of one flat parameter, the arrays here numpy views of the same memory
  (updated in place by the torch optimizer, load_state_dict and Outer-PPO's
  copy_); the gradient lands in the flat parameter's .grad and the algorithm's
  own torch optimizer steps it - so Outer-PPO and HP3O, which reuse PPO's
  minibatch step and act, run on this backend unchanged. (Their optimizer
  state then holds one flat tensor: a numpy-backend checkpoint resumes only a
  numpy-backend run, which the config check enforces anyway.)

What differs: float rounding (numpy's BLAS sums in another order than torch's),
so the same seed gives a different - statistically equivalent - curve than the
torch backend. The suites committed before this became the default were made
with `backend=torch` (their experiment files pin it) and reproduce bit for bit there.
An algorithm that changes PPO's minibatch loss (overrides minibatch_step) is refused
on this backend, at config time and in PPO.__init__.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from algorithms.core import LOG_SQRT_2PI, ActorCritic

Layers = list[tuple[np.ndarray, np.ndarray]]  # (weight [out, in], bias [out]) per linear layer


def mlp_forward(layers: Layers, x: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """tanh MLP (core.MLP); also returns each layer's input, which the backward pass needs."""
    inputs = []
    for weight, bias in layers[:-1]:
        inputs.append(x)
        x = np.tanh(x @ weight.T + bias)
    inputs.append(x)
    weight, bias = layers[-1]
    return x @ weight.T + bias, inputs


def mlp_backward(layers: Layers, inputs: list[np.ndarray], d_out: np.ndarray, grads: Layers) -> None:
    """Write into grads [(dW0, db0), (dW1, db1), ...] the gradient of a scalar loss given d loss / d output."""
    d_pre = d_out  # gradient at the current layer's pre-activation
    ones = np.ones(d_out.shape[0], np.float32)  # bias gradient = column sums, as a (faster) matrix product
    for index in reversed(range(len(layers))):
        layer_input = inputs[index]
        np.matmul(d_pre.T, layer_input, out=grads[index][0])
        np.matmul(ones, d_pre, out=grads[index][1])
        if index > 0:
            # layer_input = tanh(previous pre-activation); tanh' = 1 - tanh^2
            d_pre = (d_pre @ layers[index][0]) * (1.0 - layer_input * layer_input)


def min_branch_weight(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """1 where min(a, b) takes its gradient from a, else 0.

    torch.min and torch.max split a tie's gradient 1/2 : 1/2. Below, a tie means the clip is
    inactive (both branches are then the same function, so the split does not
    matter) or the advantage is 0 - except for exact float coincidences such as
    a clipped value error equal to minus the unclipped one, which have measure zero.
    """
    return (a <= b).astype(np.float32)


def inside(x: np.ndarray, low: float, high: float) -> np.ndarray:
    """Where torch.clamp(x, low, high) passes the gradient through (bounds included)."""
    return ((x >= low) & (x <= high)).astype(np.float32)


class NumpyActorCritic:
    """Numpy views of an ActorCritic's parameters, and the act / minibatch-step math on them."""

    def __init__(self, policy: ActorCritic):
        self.discrete = policy.discrete
        # Parameters in the order minibatch_grads writes their gradients.
        self.parameters = [p for layer in policy.critic.layers for p in (layer.weight, layer.bias)]
        self.parameters += [p for layer in policy.actor.layers for p in (layer.weight, layer.bias)]
        if not self.discrete:
            self.parameters.append(policy.actor_logstd)
        self.num_critic_layers, self.num_actor_layers = len(policy.critic.layers), len(policy.actor.layers)
        # All parameters become views of one flat parameter, and all gradients views of one
        # flat gradient: the optimizer then steps one tensor (its per-tensor Python overhead
        # dominated the optimizer step) and the norm clip is one dot product.
        self.flat_parameter = nn.Parameter(torch.cat([p.detach().reshape(-1) for p in self.parameters]))
        self.flat_parameter.grad = torch.zeros_like(self.flat_parameter)
        self.bind(self.flat_parameter.data, self.flat_parameter.grad)

    def bind(self, storage: torch.Tensor, grad_storage: torch.Tensor) -> None:
        """Move the parameters (their current values) into `storage` and their gradient into `grad_storage`.

        Both are flat float32 tensors of the parameter count, e.g. rows of the [seeds, parameters]
        arrays of a batched run (algorithms/batched.py); the flat parameter keeps its identity, so
        an optimizer built on it steps the new memory.
        """
        storage.copy_(self.flat_parameter.data)
        self.flat_parameter.data = storage
        self.flat_parameter.grad = grad_storage
        self.flat_grad = grad_storage.numpy()
        self.offsets = np.cumsum([0, *(p.numel() for p in self.parameters)])
        grad_views = []
        for param, start, stop in zip(self.parameters, self.offsets[:-1], self.offsets[1:]):
            param.data = storage[start:stop].view(param.shape)
            grad_views.append(self.flat_grad[start:stop].reshape(param.shape))
        views = [param.detach().numpy() for param in self.parameters]
        layers = list(zip(views[0::2], views[1::2]))  # (weight, bias) pairs; an odd last view is the log std
        self.critic: Layers = layers[:self.num_critic_layers]
        self.actor: Layers = layers[self.num_critic_layers:self.num_critic_layers + self.num_actor_layers]
        self.actor_logstd = None if self.discrete else views[-1]
        for param, view in zip(self.parameters, self.views()):
            assert np.shares_memory(param.detach().numpy(), view)
        pairs = list(zip(grad_views[0::2], grad_views[1::2]))
        self.critic_grads, self.actor_grads = pairs[:len(self.critic)], pairs[len(self.critic):]  # (dW, db) pairs
        self.actor_logstd_grad = None if self.discrete else grad_views[-1]

    def views(self) -> list[np.ndarray]:
        views = [array for layer in self.critic + self.actor for array in layer]
        return views if self.discrete else [*views, self.actor_logstd]

    # -- acting ---------------------------------------------------------------

    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """ActorCritic.act: (action, log_prob, value), the noise drawn by torch as there."""
        x = obs.numpy()
        head, _ = mlp_forward(self.actor, x)
        value = mlp_forward(self.critic, x)[0][:, 0]
        if self.discrete:
            log_probs = log_softmax(head)
            # torch.multinomial(probs, 1) is argmax(probs / q) with q ~ Exp(1) drawn by
            # empty_like(probs).exponential_(1) (ATen's one-sample fast path); drawn the same way
            # here it gives the same samples from the same generator state, without multinomial's
            # input checks. tests/test_numpy_backend.py holds it to that.
            exponential = torch.empty(log_probs.shape).exponential_(1).numpy()
            action = np.argmax(np.exp(log_probs) / exponential, axis=-1)
            log_prob = log_probs[np.arange(len(head)), action]
            return torch.from_numpy(action), torch.from_numpy(log_prob), torch.from_numpy(value)
        noise = torch.randn(head.shape).numpy()  # the draws of torch.randn_like(head)
        action = head + np.exp(self.actor_logstd) * noise
        log_prob = (-0.5 * noise * noise - self.actor_logstd - np.float32(LOG_SQRT_2PI)).sum(-1)
        return torch.from_numpy(action), torch.from_numpy(log_prob), torch.from_numpy(value)

    # -- one minibatch of the PPO loss -----------------------------------------

    def minibatch_grads(self, minibatch: dict[str, torch.Tensor], cfg) -> dict[str, float]:
        """Write into flat_parameter.grad the gradient of PPO.minibatch_step's loss w.r.t. self.parameters, clipped
        to norm cfg.max_grad_norm as torch.nn.utils.clip_grad_norm_ does; return the step's statistics
        (those of minibatch_step, in the same order).

        loss = -mean(min(r A, clip(r, 1-e, 1+e) A)) + c_v * value_loss - c_e * mean(entropy)
        """
        obs = minibatch["obs"].numpy()
        actions = minibatch["actions"].numpy()
        old_log_prob = minibatch["log_probs"].numpy()
        old_values = minibatch["values"].numpy()
        returns = minibatch["returns"].numpy()
        advantages = minibatch["advantages"].numpy()
        batch_size = obs.shape[0]

        # Policy: log-prob and entropy of the stored actions (ActorCritic.evaluate).
        head, actor_inputs = mlp_forward(self.actor, obs)
        if self.discrete:
            log_probs = log_softmax(head)
            probs = np.exp(log_probs)
            taken = actions.astype(np.int64)
            new_log_prob = log_probs[np.arange(batch_size), taken]
            entropy = -(probs * log_probs).sum(-1)
        else:
            inv_std = np.exp(-self.actor_logstd)
            z = (actions - head) * inv_std
            new_log_prob = (-0.5 * z * z - self.actor_logstd - np.float32(LOG_SQRT_2PI)).sum(-1)
            entropy = np.full(batch_size, (0.5 + np.float32(LOG_SQRT_2PI) + self.actor_logstd).sum(), np.float32)

        if cfg.norm_adv and batch_size > 1:  # per minibatch (PPO detail #7), unbiased std as torch's
            centered = advantages - advantages.sum() / np.float32(batch_size)
            std = np.sqrt(np.dot(centered, centered) / np.float32(batch_size - 1))
            advantages = centered / (std + np.float32(1e-8))

        # Clipped surrogate (core.clipped_policy_loss).
        clip = cfg.clip_coef
        log_ratio = new_log_prob - old_log_prob
        ratio = np.exp(log_ratio)
        clipped_ratio = np.clip(ratio, 1.0 - clip, 1.0 + clip)
        unclipped, clipped = advantages * ratio, advantages * clipped_ratio
        policy_loss = -np.minimum(unclipped, clipped).sum() / batch_size
        to_unclipped = min_branch_weight(unclipped, clipped)
        d_ratio = -(to_unclipped + (1.0 - to_unclipped) * inside(ratio, 1.0 - clip, 1.0 + clip)) * advantages / batch_size
        d_new_log_prob = d_ratio * ratio

        # Value loss (core.value_loss), with PPO's value clipping when clip_vloss.
        new_values, critic_inputs = mlp_forward(self.critic, obs)
        new_values = new_values[:, 0]
        error = new_values - returns
        if cfg.clip_vloss:
            delta = new_values - old_values
            clipped_error = old_values + np.clip(delta, -clip, clip) - returns
            squared, clipped_squared = error * error, clipped_error * clipped_error
            v_loss = 0.5 * np.maximum(squared, clipped_squared).sum() / batch_size
            to_squared = (squared >= clipped_squared).astype(np.float32)  # where max() takes `squared` (ties as below)
            d_values = (to_squared * error
                        + (1.0 - to_squared) * clipped_error * inside(delta, -clip, clip)) / batch_size
        else:
            v_loss = 0.5 * np.dot(error, error) / batch_size
            d_values = error / batch_size
        d_values = cfg.vf_coef * d_values

        entropy_mean = entropy.sum() / batch_size
        loss = policy_loss + cfg.vf_coef * v_loss - cfg.ent_coef * entropy_mean

        # Back through the policy head.
        if self.discrete:
            one_hot = np.zeros_like(probs)
            one_hot[np.arange(batch_size), taken] = 1.0
            d_head = d_new_log_prob[:, None] * (one_hot - probs)
            # d entropy_i / d logits = -p (log p + H_i); the loss has -c_e * mean(entropy).
            d_head += (cfg.ent_coef / batch_size) * probs * (log_probs + entropy[:, None])
        else:
            d_head = d_new_log_prob[:, None] * z * inv_std
            # d log_prob / d log_std = z^2 - 1; d mean(entropy) / d log_std = 1.
            self.actor_logstd_grad[:] = d_new_log_prob @ (z * z - 1.0) - np.float32(cfg.ent_coef)
        mlp_backward(self.critic, critic_inputs, d_values[:, None], self.critic_grads)
        mlp_backward(self.actor, actor_inputs, d_head, self.actor_grads)
        grad_norm = clip_grad_norm(self.flat_grad, cfg.max_grad_norm)

        stats = {
            "loss": float(loss),
            "policy_loss": float(policy_loss),
            "value_loss": float(v_loss),
            "entropy": float(entropy_mean),
            "approx_kl": float(((ratio - 1.0) - log_ratio).sum()) / batch_size,
            "clip_fraction": np.count_nonzero(np.abs(ratio - 1.0) > clip) / batch_size,
            "grad_norm": grad_norm,
            "ratio_mean": float(ratio.sum()) / batch_size,
            "ratio_max": float(ratio.max()),
        }
        return stats


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def clip_grad_norm(flat_grad: np.ndarray, max_norm: float) -> float:
    """torch.nn.utils.clip_grad_norm_ on the flat gradient: scale by min(1, max_norm / (norm + 1e-6)); return the norm."""
    total_norm = math.sqrt(float(np.dot(flat_grad, flat_grad)))
    scale = max_norm / (total_norm + 1e-6)
    if scale < 1.0:
        flat_grad *= np.float32(scale)
    return total_norm
