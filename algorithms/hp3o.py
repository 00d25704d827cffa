"""HP3O and HP3O+ (Liu et al. 2025, arXiv:2502.15968), docs/algorithms.md section 4.

PPO with a FIFO replay buffer of complete episodes. Each iteration the trainer
collects a rollout exactly as for PPO (same env-step budget); update() stitches
the rollout's rows into per-env episodes, pushes the episodes that ended, and
trains on hybrid batches redrawn every epoch: the best-return trajectory in the
buffer plus k-1 others drawn uniformly without replacement, up to S/k steps
from each. The loss is PPO's (PPO.minibatch_step, reused), with the ratio
taken against each step's stored behaviour log-prob.

Choices the paper leaves open, made here:
- Steps within a trajectory: a uniform random subset (without replacement),
  not a contiguous window. GAE is computed over the whole trajectory first,
  so contiguity buys nothing and a subset decorrelates the minibatch.
- Before the buffer holds any complete episode (first iterations of a task
  whose episodes outlast a rollout), the update is a plain PPO update on the
  current rollout's valid rows, with HP3O's epochs and minibatch size.
- Advantages: by default GAE from the values stored at collection, computed
  once when the trajectory enters the buffer (reference behaviour). With
  recompute_advantages, V(s_t) of every stored state is re-evaluated with the
  current critic once per update; the bootstrap value of a truncated ending
  stays the one recorded at collection, because the Rollout does not carry
  the final observation of an episode truncated on its last row.
- Value targets = GAE advantages + the values they were computed from.
- HP3O+ (best_baseline): for each state s_t of a non-best trajectory, the
  nearest state s* of the best trajectory (Euclidean, in the stored normalised
  obs space); if V(s*) > V(s_t) and the distance <= baseline_distance_threshold,
  V(s*) replaces V(s_t) as the baseline in the TD error
  delta_t = r_t + gamma V(s_{t+1}) - baseline_t, and GAE sums these deltas.
  Only the policy's advantages change; the critic's targets stay the plain
  GAE returns, so the critic still learns V and not the max with the best path.
- Age of a trajectory = current iteration - the iteration whose rollout ended
  it; old_policy_fraction counts steps per step (a stitched episode mixes
  steps from two or more iterations).
- Stored observations are normalised with the statistics of their collection
  time; the normaliser keeps moving, so old trajectories are slightly off-scale
  (the price of replay with running normalisation).
Memory: at most buffer_size trajectories plus one unfinished episode per env;
both are bounded by the task's episode length (its time limit).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import NamedTuple

import torch

from algorithms.core import Rollout, compute_gae
from algorithms.ppo import PPO, Batch, PPOConfig
from algorithms.schema import Flag, PositiveFloat, PositiveInt

# Per-step fields an unfinished episode accumulates between update() calls.
STEP_FIELDS = ("obs", "actions", "rewards", "raw_rewards", "log_probs", "values", "collected_at")


class EndedEpisode(NamedTuple):
    """An episode that ended in this rollout, before its targets are computed."""

    end_row: int
    env: int
    steps: dict[str, torch.Tensor]  # STEP_FIELDS, partial episode + this rollout's rows
    terminated: bool
    truncated: bool
    bootstrap_value: float


@dataclass
class Trajectory:
    """One complete episode, as collected. Tensors have length L (its number of steps)."""

    obs: torch.Tensor  # [L, obs_dim], normalised as the policy saw them
    actions: torch.Tensor  # [L, ...] unclipped, as stored and scored
    rewards: torch.Tensor  # [L] scaled rewards (what the loss sees)
    log_probs: torch.Tensor  # [L] behaviour policy's log-probs
    values: torch.Tensor  # [L] critic's values at collection
    collected_at: torch.Tensor  # [L] int64, the iteration that collected each step
    advantages: torch.Tensor  # [L] GAE from the stored values, computed once on entry
    returns: torch.Tensor  # [L] advantages + values
    raw_return: float  # sum of the env's own rewards: the true episodic return, picks the best
    terminated: bool
    truncated: bool
    bootstrap_value: float  # V(final obs) at collection for a truncated ending, else 0
    completed_at: int  # the iteration whose rollout ended the episode

    def __len__(self) -> int:
        return self.obs.shape[0]

    def state_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_state_dict(cls, state: dict) -> "Trajectory":
        return cls(**state)


class TrajectoryBuffer:
    """FIFO of complete trajectories: pushing onto a full buffer evicts the oldest."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.trajectories: deque[Trajectory] = deque(maxlen=capacity)

    def __len__(self) -> int:
        return len(self.trajectories)

    def __getitem__(self, index: int) -> Trajectory:
        return self.trajectories[index]

    def push(self, trajectory: Trajectory) -> None:
        self.trajectories.append(trajectory)  # deque(maxlen) drops the leftmost (oldest)

    def best_index(self) -> int:
        """Index of the highest raw return (the oldest one on ties)."""
        returns = [trajectory.raw_return for trajectory in self.trajectories]
        return max(range(len(returns)), key=returns.__getitem__)

    def draw_indices(self, k: int) -> list[int]:
        """The best trajectory first, then k-1 others uniformly without replacement (all if fewer)."""
        best = self.best_index()
        others = [index for index in range(len(self)) if index != best]
        picks = torch.randperm(len(others))[: k - 1].tolist()
        return [best] + [others[p] for p in picks]

    def num_steps(self) -> int:
        return sum(len(trajectory) for trajectory in self.trajectories)

    def state_dict(self) -> dict:
        return {"capacity": self.capacity, "trajectories": [t.state_dict() for t in self.trajectories]}

    def load_state_dict(self, state: dict) -> None:
        self.capacity = state["capacity"]
        self.trajectories = deque((Trajectory.from_state_dict(t) for t in state["trajectories"]), maxlen=self.capacity)


def trajectory_gae(rewards: list[torch.Tensor], values: list[torch.Tensor], bootstrap_values: list[float],
                   terminated: list[bool], gamma: float, gae_lambda: float) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """GAE over each trajectory, batched by padding into one [L_max, n] call of compute_gae.

    Each column ends at its trajectory's last row with its terminated or truncated
    flag, so the recursion stops there; a truncated ending bootstraps from the value
    one row below (the first padding row, or next_value for the longest column).
    Padding rows are marked invalid and cut off again.
    """
    lengths = [r.shape[0] for r in rewards]
    longest, count = max(lengths), len(lengths)
    padded_rewards = torch.zeros(longest, count)
    padded_values = torch.zeros(longest, count)
    next_value = torch.zeros(count)
    ends_terminated = torch.zeros(longest, count, dtype=torch.bool)
    ends_truncated = torch.zeros(longest, count, dtype=torch.bool)
    valid = torch.zeros(longest, count, dtype=torch.bool)
    for column, length in enumerate(lengths):
        padded_rewards[:length, column] = rewards[column]
        padded_values[:length, column] = values[column]
        valid[:length, column] = True
        if terminated[column]:
            ends_terminated[length - 1, column] = True
        else:
            ends_truncated[length - 1, column] = True
        if length < longest:
            padded_values[length, column] = bootstrap_values[column]
        else:
            next_value[column] = bootstrap_values[column]
    advantages, returns = compute_gae(padded_rewards, padded_values, next_value, ends_terminated, ends_truncated,
                                      valid, gamma, gae_lambda)
    return [(advantages[:length, column].clone(), returns[:length, column].clone())
            for column, length in enumerate(lengths)]


@dataclass
class HP3OConfig(PPOConfig):
    """algo.* of HP3O and HP3O+ (conf/algo/hp3o*.yaml), beyond PPO's."""
    buffer_size: PositiveInt
    trajectories_per_batch: PositiveInt
    steps_per_batch: PositiveInt
    minibatch_size: PositiveInt
    recompute_advantages: Flag
    best_baseline: Flag
    baseline_distance_threshold: PositiveFloat


class HP3O(PPO):
    Config = HP3OConfig

    @classmethod
    def check_config(cls, algo: dict, rollout_size: int) -> list[str]:
        """k <= buffer_size, and at least one step per drawn trajectory (minibatches have a fixed size,
        so PPO's num_minibatches check does not apply)."""
        errors = []
        k = algo["trajectories_per_batch"]
        if k > algo["buffer_size"]:
            errors.append(f"algo.trajectories_per_batch must be <= algo.buffer_size = {algo['buffer_size']}, "
                          f"got {k}")
        if algo["steps_per_batch"] < k:
            errors.append(f"algo.steps_per_batch must be >= algo.trajectories_per_batch = {k} (at least one step "
                          f"per trajectory), got {algo['steps_per_batch']}")
        return errors

    def __init__(self, obs_dim: int, action_dim: int, discrete: bool, cfg, num_iterations: int,
                 network: dict | None = None):
        super().__init__(obs_dim, action_dim, discrete, cfg, num_iterations, network)
        self.buffer = TrajectoryBuffer(self.cfg.buffer_size)
        # One unfinished episode per env (dict of STEP_FIELDS tensors, or None), sized on the first rollout.
        self.partial_episodes: list[dict | None] = []
        # Within one update (begin_update to end_update): how each epoch draws its batch, and what was drawn.
        self.draw_batch, self.batch_counts, self.update_iteration = None, None, None

    # -- stitching rollouts into episodes -------------------------------------

    def ingest(self, rollout: Rollout, iteration: int) -> None:
        """Append the rollout's valid rows to each env's episode; push the episodes that ended.

        Reset rows (valid False) never enter: they belong to no episode. An episode
        that ended on row t bootstraps (if truncated) from values[t+1], the value of
        the reset row whose obs is the final observation, or next_value at t = T-1.
        """
        T, N = rollout.num_steps, rollout.num_envs
        if len(self.partial_episodes) != N:
            self.partial_episodes = [None] * N
        ended = (rollout.terminated | rollout.truncated) & rollout.valid
        episodes: list[EndedEpisode] = []
        for env in range(N):
            start = 0
            for end in torch.nonzero(ended[:, env]).flatten().tolist():
                steps = self.join_steps(self.partial_episodes[env], self.rows(rollout, env, start, end + 1, iteration))
                self.partial_episodes[env] = None
                terminated = bool(rollout.terminated[end, env])
                truncated = bool(rollout.truncated[end, env])
                bootstrap = 0.0
                if not terminated:
                    bootstrap = float(rollout.values[end + 1, env] if end + 1 < T else rollout.next_value[env])
                episodes.append(EndedEpisode(end, env, steps, terminated, truncated, bootstrap))
                start = end + 1
            if start < T:
                tail = self.rows(rollout, env, start, T, iteration)
                if tail["obs"].shape[0] > 0:
                    self.partial_episodes[env] = self.join_steps(self.partial_episodes[env], tail)
        if not episodes:
            return
        episodes.sort(key=lambda episode: (episode.end_row, episode.env))  # push in order of completion
        targets = trajectory_gae([e.steps["rewards"] for e in episodes], [e.steps["values"] for e in episodes],
                                 [e.bootstrap_value for e in episodes], [e.terminated for e in episodes],
                                 self.cfg.gamma, self.cfg.gae_lambda)
        for episode, (advantages, returns) in zip(episodes, targets):
            steps = episode.steps
            trajectory = Trajectory(
                obs=steps["obs"], actions=steps["actions"], rewards=steps["rewards"],
                log_probs=steps["log_probs"], values=steps["values"], collected_at=steps["collected_at"],
                advantages=advantages, returns=returns, raw_return=float(steps["raw_rewards"].sum()),
                terminated=episode.terminated, truncated=episode.truncated,
                bootstrap_value=episode.bootstrap_value, completed_at=iteration,
            )
            self.buffer.push(trajectory)

    @staticmethod
    def rows(rollout: Rollout, env: int, start: int, stop: int, iteration: int) -> dict[str, torch.Tensor]:
        """Valid rows start..stop-1 of one env. Boolean indexing copies: the trainer overwrites the rollout."""
        keep = rollout.valid[start:stop, env]
        return {
            "obs": rollout.obs[start:stop, env][keep],
            "actions": rollout.actions[start:stop, env][keep],
            "rewards": rollout.rewards[start:stop, env][keep],
            "raw_rewards": rollout.raw_rewards[start:stop, env][keep],
            "log_probs": rollout.log_probs[start:stop, env][keep],
            "values": rollout.values[start:stop, env][keep],
            "collected_at": torch.full((int(keep.sum()),), iteration, dtype=torch.int64),
        }

    @staticmethod
    def join_steps(first: dict | None, second: dict) -> dict:
        if first is None:
            return second
        return {key: torch.cat([first[key], second[key]]) for key in STEP_FIELDS}

    # -- advantages and hybrid batches -----------------------------------------

    def update_targets(self) -> list[dict[str, torch.Tensor]]:
        """Per buffer trajectory: the values, advantages and returns this update trains on,
        and which TD baselines HP3O+ replaced."""
        cfg = self.cfg
        trajectories = list(self.buffer.trajectories)
        if cfg.recompute_advantages:
            with torch.no_grad():
                all_values = self.policy.value(torch.cat([t.obs for t in trajectories]))
            values = list(torch.split(all_values, [len(t) for t in trajectories]))
            plain = trajectory_gae([t.rewards for t in trajectories], values,
                                   [t.bootstrap_value for t in trajectories], [t.terminated for t in trajectories],
                                   cfg.gamma, cfg.gae_lambda)
        else:
            values = [t.values for t in trajectories]
            plain = [(t.advantages, t.returns) for t in trajectories]
        targets = [{"values": v, "advantages": a, "returns": r, "replaced": torch.zeros(len(v), dtype=torch.bool)}
                   for v, (a, r) in zip(values, plain)]
        if cfg.best_baseline:
            self.apply_best_baseline(trajectories, targets)
        return targets

    def apply_best_baseline(self, trajectories: list[Trajectory], targets: list[dict]) -> None:
        """HP3O+: swap in V(nearest best-trajectory state) as the TD baseline where it is higher and close enough."""
        cfg = self.cfg
        best = self.buffer.best_index()
        best_obs, best_values = trajectories[best].obs, targets[best]["values"]
        others = [index for index in range(len(trajectories)) if index != best]
        if not others:
            return
        shifted_rewards = []
        for index in others:
            values = targets[index]["values"]
            distances, nearest = torch.cdist(trajectories[index].obs, best_obs).min(dim=1)
            candidate = best_values[nearest]
            replaced = (candidate > values) & (distances <= cfg.baseline_distance_threshold)
            baseline = torch.where(replaced, candidate, values)
            # r_t - (b_t - V_t) + gamma V_{t+1} - V_t = r_t + gamma V_{t+1} - b_t: compute_gae then sums the new deltas.
            shifted_rewards.append(trajectories[index].rewards - (baseline - values))
            targets[index]["replaced"] = replaced
        shifted = trajectory_gae(shifted_rewards, [targets[i]["values"] for i in others],
                                 [trajectories[i].bootstrap_value for i in others],
                                 [trajectories[i].terminated for i in others], cfg.gamma, cfg.gae_lambda)
        for index, (advantages, _returns) in zip(others, shifted):
            targets[index]["advantages"] = advantages  # returns (critic targets) stay the plain GAE ones

    def draw_hybrid_batch(self, targets: list[dict]) -> tuple[Batch, list[int]]:
        """One epoch's batch: the best trajectory + k-1 uniform others, up to S/k random steps from each."""
        cfg = self.cfg
        chosen = self.buffer.draw_indices(cfg.trajectories_per_batch)
        steps_per_trajectory = max(1, cfg.steps_per_batch // cfg.trajectories_per_batch)
        parts = []
        for index in chosen:
            trajectory, target = self.buffer[index], targets[index]
            steps = torch.randperm(len(trajectory))[:steps_per_trajectory]
            parts.append({
                "obs": trajectory.obs[steps],
                "actions": trajectory.actions[steps],
                "log_probs": trajectory.log_probs[steps],
                "values": target["values"][steps],
                "advantages": target["advantages"][steps],
                "returns": target["returns"][steps],
                "collected_at": trajectory.collected_at[steps],
                "replaced": target["replaced"][steps],
            })
        batch = {key: torch.cat([part[key] for part in parts]) for key in parts[0]}
        return batch, chosen

    # -- learning ---------------------------------------------------------------

    def begin_update(self, rollout: Rollout, batch: Batch, iteration: int) -> float:
        """The rollout's completed episodes into the buffer; what each epoch will draw from (epoch_batches)."""
        self.ingest(rollout, iteration)
        if len(self.buffer) == 0:
            # No complete episode yet: a PPO update on this rollout (reset rows dropped), HP3O's epochs/minibatches.
            batch["collected_at"] = torch.full((batch["obs"].shape[0],), iteration, dtype=torch.int64)
            batch["replaced"] = torch.zeros(batch["obs"].shape[0], dtype=torch.bool)

            def draw_batch() -> Batch:
                return batch
        else:
            targets = self.update_targets()

            def draw_batch() -> Batch:
                return self.draw_hybrid_batch(targets)[0]
        self.draw_batch, self.update_iteration = draw_batch, iteration
        self.batch_counts = {"sampled": 0, "older": 0, "replaced": 0, "epochs": 0}
        return self.annealed_lr(iteration)

    def epoch_batches(self, batch: Batch) -> Iterator[Batch]:
        """A freshly drawn hybrid batch per epoch (drawn lazily: a target-KL stop draws no more)."""
        counts = self.batch_counts
        for _epoch in range(self.cfg.update_epochs):
            drawn = self.draw_batch()
            counts["epochs"] += 1
            counts["sampled"] += drawn["obs"].shape[0]
            counts["older"] += int((drawn["collected_at"] < self.update_iteration).sum())
            counts["replaced"] += int(drawn["replaced"].sum())
            yield drawn

    def end_update(self, batch: Batch, iteration: int, stats: dict[str, float]) -> dict[str, float]:
        """What the batches were made of, and the buffer's state."""
        lr, counts = stats.pop("lr"), self.batch_counts
        stats["batch_steps"] = counts["sampled"] / counts["epochs"]
        stats["old_policy_fraction"] = counts["older"] / counts["sampled"]
        stats["baseline_replaced_fraction"] = (
            counts["replaced"] / counts["sampled"] if self.cfg.best_baseline else float("nan")
        )
        stats.update(self.buffer_stats(iteration))
        stats["lr"] = lr
        self.draw_batch = self.batch_counts = None
        return stats

    def num_minibatches(self, num_samples: int) -> int:
        """HP3O fixes the minibatch size, not the count: near-equal minibatches of at most minibatch_size."""
        return math.ceil(num_samples / self.cfg.minibatch_size)

    def minibatch_rows_at_most(self, rollout_size: int) -> int:
        return self.cfg.minibatch_size

    def buffer_stats(self, iteration: int) -> dict[str, float]:
        trajectories = self.buffer.trajectories
        if not trajectories:
            return {"buffer_fill": 0, "buffer_steps": 0, "buffer_mean_age": float("nan"),
                    "buffer_best_return": float("nan")}
        return {
            "buffer_fill": len(trajectories),
            "buffer_steps": self.buffer.num_steps(),
            "buffer_mean_age": sum(iteration - t.completed_at for t in trajectories) / len(trajectories),
            "buffer_best_return": max(t.raw_return for t in trajectories),
        }

    # -- checkpoints ------------------------------------------------------------

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["buffer"] = self.buffer.state_dict()
        state["partial_episodes"] = list(self.partial_episodes)
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.buffer.load_state_dict(state["buffer"])
        self.partial_episodes = list(state["partial_episodes"])
