"""The policy network of token tasks (env.network.kind=causal_lm): a causal language model and a value model.

The same methods as the MLP ActorCritic (algorithms/core.py), so PPO and every variant run on it
unchanged; what differs is what an observation is: a token sequence, right-padded with <pad>
(id 0), as the token envs give it (benchmarks/rlhf/env.py). The distribution over the next token
is read at the last non-padding position.

    actor   a `transformers` causal LM (`AutoModelForCausalLM.from_pretrained(init_from)`): RLHF
            starts the policy from the supervised reference model, so init_from is the reference's
            directory, or rlhf/<task> for the cached reference of a task of this suite
    critic  a separate value model, as in TRL's PPOTrainer: the same transformer body, also
            initialised from init_from, and a linear head on the last position's hidden state
            (initialised at 0, so the first values are 0)

Sampling is at env.network.temperature (logits / T) and every log-probability, the stored ones
and those the update recomputes, is of that same tempered distribution (as TRL does). The
evaluation action is the most likely token (greedy decoding). Dropout must be 0 in the loaded
config (checked): the PPO ratio compares the same network before and after an update.

<pad> and <bos> are never generated: their probability is set to 0 in every next-token
distribution, the policy's and the reference's alike (so the KL between them is over the same
support). A generated <pad> would otherwise be read as padding, and the next position would be
taken from the wrong place; <bos> only starts a prompt. (HF `generate` does the same with
`suppress_tokens`.)
"""

from __future__ import annotations

import torch
from torch import nn

PAD_ID, BOS_ID = 0, 1  # the first special tokens of every token task's vocabulary (benchmarks/rlhf/tasks.py)
NEVER_GENERATED = (PAD_ID, BOS_ID)


def last_positions(tokens: torch.Tensor) -> torch.Tensor:
    """Index of the last non-padding token of each right-padded row."""
    return (tokens != PAD_ID).sum(-1) - 1


def padding_mask(tokens: torch.Tensor) -> torch.Tensor:
    return (tokens != PAD_ID).long()


def next_token_log_probs(model, tokens: torch.Tensor, temperature: float,
                         lengths: torch.Tensor | None = None) -> torch.Tensor:
    """log p(. | sequence) at temperature T for each right-padded row of token ids, read at its last
    position: [rows, vocab]. The policy's distribution and, in the token env, the reference's. lengths: each
    row's length where the caller knows it (the env does); otherwise the count of non-padding tokens."""
    if lengths is None:
        mask, last = padding_mask(tokens), last_positions(tokens)
    else:
        mask, last = (torch.arange(tokens.shape[1]) < lengths.unsqueeze(-1)).long(), lengths - 1
    logits = model(input_ids=tokens, attention_mask=mask).logits[torch.arange(len(tokens)), last] / temperature
    # the smallest finite logit rather than -inf: probability exactly 0, and p log p = 0 in the entropy
    logits[:, list(NEVER_GENERATED)] = torch.finfo(logits.dtype).min
    return torch.log_softmax(logits, dim=-1)


class ValueModel(nn.Module):
    def __init__(self, body: nn.Module, width: int):
        super().__init__()
        self.body = body
        self.head = nn.Linear(width, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.body(input_ids=tokens, attention_mask=padding_mask(tokens)).last_hidden_state
        return self.head(hidden[torch.arange(len(tokens)), last_positions(tokens)]).squeeze(-1)


class CausalLMActorCritic(nn.Module):
    discrete = True

    def __init__(self, action_dim: int, init_from: str, temperature: float = 1.0):
        super().__init__()
        from transformers import AutoModelForCausalLM

        self.actor = AutoModelForCausalLM.from_pretrained(init_from)  # a model directory (the engine resolves rlhf/<task>)
        for key in ("resid_pdrop", "embd_pdrop", "attn_pdrop", "dropout", "hidden_dropout", "attention_dropout"):
            if getattr(self.actor.config, key, 0.0):
                raise ValueError(f"env.network.init_from={init_from}: the model's {key} is "
                                 f"{getattr(self.actor.config, key)}; PPO needs dropout 0")
        if self.actor.config.vocab_size != action_dim:
            raise ValueError(f"env.network.init_from={init_from}: its vocabulary has {self.actor.config.vocab_size} "
                             f"tokens, the task's action space {action_dim}")
        self.critic = ValueModel(AutoModelForCausalLM.from_pretrained(init_from).base_model, self.actor.config.hidden_size)
        self.temperature = float(temperature)

    def actor_parameters(self) -> list[nn.Parameter]:
        return list(self.actor.parameters())

    def next_token_log_probs(self, obs: torch.Tensor) -> torch.Tensor:
        return next_token_log_probs(self.actor, obs.long(), self.temperature)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs.long())

    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        log_probs = self.next_token_log_probs(obs)
        action = torch.multinomial(log_probs.exp(), 1).squeeze(-1)
        return action, log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1), self.value(obs)

    def act_deterministic(self, obs: torch.Tensor) -> torch.Tensor:
        return self.next_token_log_probs(obs).argmax(-1)

    def evaluate(self, obs: torch.Tensor, actions: torch.Tensor):
        log_prob, entropy = self.evaluate_actor(obs, actions)
        return log_prob, entropy, self.value(obs)

    def evaluate_actor(self, obs: torch.Tensor, actions: torch.Tensor):
        log_probs = self.next_token_log_probs(obs)
        log_prob = log_probs.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        return log_prob, entropy
