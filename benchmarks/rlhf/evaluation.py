"""The token tasks' evaluation: responses sampled at the training temperature to fixed prompts.

Greedy decoding saturates on these tasks (the most likely review of Praise and the most likely sum of
Arithmetic are what nearly every trained policy writes), so a token task's evaluation samples, as the
policy does in training (env.evaluation.kind=sampled): `prompts` prompts drawn from `seed` and one
response to each sampled at the policy's temperature from a generator seeded with `seed`, the same
prompts and seed at every evaluation of every run. Two evaluations of one policy give the same
numbers; two policies are scored on the same prompts with the same random draws. Per response:

    reward           what the run's env pays (env.kwargs.reward: the reward model's normalised score, or the
                     judge's), minus missing_eos_penalty for a response cut off without <eos>: eval.csv's
                     eval_return_mean, the number of the evaluation curves, final scores and claims
    reward_model     the reward model's score, normalised as the env normalises it (0: the reference's mean)
    judge            the task's judge (the true score)
    kl_to_reference  the sum over the response's tokens of log pi(a_t|s_t) - log pi_ref(a_t|s_t), both at the
                     sampling temperature: the sampled estimate of KL(pi || pi_ref), as train.csv's kl_to_reference
    length           generated tokens, <eos> included

The prompts are answered in one batch: one forward pass of the policy and one of the reference per
token position (at most max_new_tokens of them) over the responses still being written, then one
of the reward model. The scores are the token env's own (TokenVectorEnv.scores), on its buffers.
"""

from __future__ import annotations

import numpy as np
import torch

from algorithms.lm_policy import next_token_log_probs
from benchmarks.engine.envs import find_spec
from benchmarks.rlhf.env import EOS_ID, TokenVectorEnv

# eval.csv's columns beside eval_return_mean and eval_return_std: the mean over the responses of each
EVAL_COLUMNS = {"eval_reward_model_mean": "reward_model", "eval_judge_mean": "judge",
                "eval_kl_to_reference_mean": "kl_to_reference", "eval_length_mean": "length"}


class SampledEvaluation:
    def __init__(self, task: str, prompts: int, seed: int, reward: str = "model", temperature: float = 1.0,
                 missing_eos_penalty: float | None = None, **env_kwargs):
        if reward not in ("model", "judge"):
            raise ValueError(f"reward must be 'model' or 'judge', got {reward!r}")
        # the env holds the prompts, the reference and the reward model; it always scores with the reward model
        # (reward="model"), and what this run's env pays is made from its two scores below
        self.env = TokenVectorEnv(prompts, task, reward="model", temperature=temperature, **env_kwargs)
        self.reward, self.missing_eos_penalty, self.seed = reward, missing_eos_penalty, seed

    @torch.inference_mode()
    def responses(self, actor: torch.nn.Module, greedy: bool = False) -> dict[str, np.ndarray]:
        """Each prompt's response by `actor` (a causal LM; greedy: its most likely token) and its numbers."""
        env, task = self.env, self.env.task
        env.reset(seed=self.seed)  # the same prompts every time
        generator = torch.Generator().manual_seed(self.seed)
        tokens, lengths = torch.as_tensor(env.tokens), torch.as_tensor(env.lengths)  # env's buffers, shared memory
        writing = torch.ones(env.num_envs, dtype=torch.bool)
        ended_with_eos = torch.zeros(env.num_envs, dtype=torch.bool)
        kl = torch.zeros(env.num_envs, dtype=torch.float64)
        while writing.any():
            rows = torch.nonzero(writing).squeeze(-1)
            log_probs = next_token_log_probs(actor, tokens[rows], env.temperature, lengths=lengths[rows])
            actions = (log_probs.argmax(-1) if greedy
                       else torch.multinomial(log_probs.exp(), 1, generator=generator).squeeze(-1))
            reference = next_token_log_probs(env.reference, tokens[rows], env.temperature, lengths=lengths[rows])
            picked = actions.unsqueeze(-1)
            kl[rows] += (log_probs.gather(-1, picked) - reference.gather(-1, picked)).squeeze(-1).double()
            tokens[rows, lengths[rows]] = actions
            lengths[rows] += 1
            ended_with_eos[rows] = actions == EOS_ID
            writing[rows] = (actions != EOS_ID) & (lengths[rows] < task.sequence_length)
        reward_model, judge = env.scores(np.ones(env.num_envs, bool))
        paid = (reward_model if self.reward == "model" else judge).copy()
        if self.missing_eos_penalty is not None:
            paid[~ended_with_eos.numpy()] -= self.missing_eos_penalty
        return {"reward": paid, "reward_model": reward_model, "judge": judge, "kl_to_reference": kl.numpy(),
                "length": (lengths - task.prompt_tokens).numpy()}

    def close(self) -> None:
        self.env.close()


class SampledEvaluator:
    """The trainer's evaluator on a token task with env.evaluation.kind=sampled: the interface of
    benchmarks/engine/trainer.py's Evaluator (called with the algorithm, returns one return per episode: here
    the reward each response is paid), the other numbers of the last evaluation in `columns` (EVAL_COLUMNS).
    Nothing carries from one evaluation to the next: its checkpointed state (envs, seed) is the same always."""

    def __init__(self, env_id: str, prompts: int, seed: int, env_kwargs: dict):
        self.evaluation = SampledEvaluation(find_spec(env_id).kwargs["task"], prompts, seed, **env_kwargs)
        self.envs, self.seed = self.evaluation.env, seed
        self.columns: dict[str, float] = {}

    def __call__(self, algorithm, obs_normalizer=None) -> np.ndarray:
        scored = self.evaluation.responses(algorithm.policy.actor)
        self.columns = {column: float(np.mean(scored[name])) for column, name in EVAL_COLUMNS.items()}
        return scored["reward"]

    def close(self) -> None:
        self.evaluation.close()
