"""RLHF's KL penalty to the reference model, charged per token in the reward (env.kl_penalty).

A token task's env gives, with every step, log pi_ref(a_t|s_t): the reference model's
log-probability of the token the policy just took (benchmarks/rlhf/env.py). The reward the
algorithm learns from is then (Ziegler et al. 2019; Stiennon et al. 2020; TRL's PPOTrainer)

    r_t = score [at the response's last token]  -  beta * (log pi(a_t|s_t) - log pi_ref(a_t|s_t))

whose sum over a response is the score minus beta times the sampled estimate of
KL(pi || pi_ref) of that response. beta is fixed (adaptive: false) or adapted after each rollout
by the proportional controller of Ziegler et al. (TRL's AdaptiveKLController):

    error = clip(KL / target - 1, -0.2, 0.2);   beta <- beta * (1 + error * n / horizon)

with KL the mean over the rollout's finished responses and n their number. The logged episode
return stays the score alone (what the reward model said); train.csv gets `kl_to_reference` (the
mean KL estimate of the responses that ended in the rollout) and `kl_coef` (beta as used in it).

whiten_rewards (TRL's option of that name, off by default): the rollout's shaped rewards are
scaled to unit standard deviation over valid steps, their mean kept ((x - mean) / std + mean),
before the advantages.
"""

from __future__ import annotations

import numpy as np
import torch

ADAPTIVE_CLIP = 0.2  # Ziegler et al.'s and TRL's clip of the proportional error


class ReferenceKLPenalty:
    def __init__(self, cfg: dict, num_envs: int):
        self.coef = float(cfg["coef"])
        self.adaptive = bool(cfg["adaptive"])
        self.target = float(cfg["target"])
        self.horizon = float(cfg["horizon"])
        self.episode_kl = np.zeros(num_envs)  # the KL estimate so far of each env's current response
        self.finished_kl: list[float] = []    # of the responses that ended in this rollout

    def __call__(self, reward: np.ndarray, log_prob: np.ndarray, ref_log_prob: np.ndarray, valid: np.ndarray,
                 episode_ended: np.ndarray) -> np.ndarray:
        """The reward to learn from for one step of every env; valid is False on an autoreset step."""
        log_ratio = np.where(valid, log_prob - ref_log_prob, 0.0)
        self.episode_kl += log_ratio
        ended = episode_ended & valid
        self.finished_kl.extend(self.episode_kl[ended].tolist())
        self.episode_kl[ended] = 0.0
        return reward - self.coef * log_ratio

    def end_rollout(self) -> dict[str, float]:
        """The rollout's statistics; adapts beta for the next rollout."""
        stats = {"kl_coef": self.coef,
                 "kl_to_reference": float(np.mean(self.finished_kl)) if self.finished_kl else float("nan")}
        if self.adaptive and self.finished_kl:
            error = np.clip(np.mean(self.finished_kl) / self.target - 1.0, -ADAPTIVE_CLIP, ADAPTIVE_CLIP)
            self.coef *= 1.0 + float(error) * len(self.finished_kl) / self.horizon
        self.finished_kl = []
        return stats

    def state_dict(self) -> dict:
        # plain float and tensor: what a weights-only checkpoint load accepts
        return {"coef": float(self.coef), "episode_kl": torch.from_numpy(self.episode_kl.copy())}

    def load_state_dict(self, state: dict) -> None:
        self.coef = state["coef"]
        self.episode_kl = state["episode_kl"].numpy().copy()


def whiten_rewards(rewards: torch.Tensor, valid: torch.Tensor) -> None:
    """TRL's masked_whiten(rewards, mask, shift_mean=False), in place over the valid steps: (x - mean) /
    sqrt(var + 1e-8) + mean, with the unbiased variance (TRL's masked_var); reset steps are left as they are."""
    values = rewards[valid]
    mean = values.mean()
    variance = ((values - mean) ** 2).mean() * (values.numel() / (values.numel() - 1))
    rewards[valid] = (values - mean) * torch.rsqrt(variance + 1e-8) + mean


class EpisodeInfoMeans:
    """A task's own numbers per finished episode, from step infos: info["episode_metrics"] = {name: per-env
    values}, with mask info["_episode_metrics"] (the token tasks' judge score). Their mean over the episodes
    that ended in a rollout is logged in train.csv as `episode_<name>`. Other tasks send none: no column."""

    def __init__(self):
        self.values: dict[str, list[float]] = {}

    def add(self, info: dict) -> None:
        if "episode_metrics" not in info:
            return
        mask = info["_episode_metrics"]
        for name, value in info["episode_metrics"].items():
            self.values.setdefault(name, []).extend(np.asarray(value)[mask].tolist())

    def end_rollout(self) -> dict[str, float]:
        stats = {f"episode_{name}": float(np.mean(v)) if v else float("nan") for name, v in self.values.items()}
        self.values = {name: [] for name in self.values}
        return stats
