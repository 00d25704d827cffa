"""Token generation as a Gymnasium vector env: one env per response being written, all stepped at once.

An observation is the sequence so far, prompt included, as token ids right-padded with <pad> (id 0)
to the task's sequence length (float32, like every task's observations; the language-model policy,
algorithms/lm_policy.py, reads them back as ids). An action is the next token. A response ends at
<eos> or at the task's max_new_tokens: either way the episode terminates (nothing follows a
finished response, so there is nothing to bootstrap). The reward is 0 on every token but the last,
which gets the response's score (the reward only at the end, as in RLHF):

    reward="model"   the task's reward model (benchmarks/rlhf/models.py), trained on the judge's
                     preferences, its score normalised to mean 0 and std 1 over the reference's
                     responses; what RLHF optimises
    reward="judge"   the task's programmatic judge itself (the checkable answer of `arithmetic`)

minus missing_eos_penalty when the response ran out of room without <eos> (TRL's option of that
name; null: no penalty). Every step's info carries "ref_log_prob", the reference model's
log-probability of the token just taken, at the sampling temperature: the trainer turns it into
the per-token KL penalty (benchmarks/engine/reference_kl.py). A finished response's info carries
"episode_metrics" {"judge": the judge's score} (mask "_episode_metrics"), which train.csv logs as
episode_judge beside the reward model's score, so that reward hacking shows.

Autoreset (autoreset=...): every step writes one token in every env, so a run's env steps are its
generated tokens and its budget counts tokens only:

    "same_step"  Gymnasium's SAME_STEP mode: the step that ends a response also starts the env's next
                 prompt, whose observation it returns (the finished sequence is in info["final_obs"],
                 mask info["_final_obs"]). No step is a no-op. A response always terminates, never
                 truncates, so nothing is bootstrapped from the observation of the next prompt.
    "next_step"  Gymnasium's NEXT_STEP mode, as the suite's other tasks: the step after a response ends
                 starts the next prompt and ignores its action (a no-op step that writes no token but
                 counts as an env step). Runs stored before "same_step" existed ran this way.
"""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from algorithms.lm_policy import next_token_log_probs
from benchmarks.rlhf.models import model_dir, reward_scores, weights_record
from benchmarks.rlhf.tasks import EOS, SPECIAL_TOKENS, get_task

EOS_ID = SPECIAL_TOKENS.index(EOS)


AUTORESET_MODES = {"same_step": AutoresetMode.SAME_STEP, "next_step": AutoresetMode.NEXT_STEP}


class TokenVectorEnv(gym.vector.VectorEnv):
    def __init__(self, num_envs: int, task: str, reward: str = "model", temperature: float = 1.0,
                 missing_eos_penalty: float | None = None, autoreset: str = "same_step"):
        from transformers import GPT2ForSequenceClassification, GPT2LMHeadModel, PreTrainedTokenizerFast

        if reward not in ("model", "judge"):
            raise ValueError(f"reward must be 'model' or 'judge', got {reward!r}")
        if autoreset not in AUTORESET_MODES:
            raise ValueError(f"autoreset must be 'same_step' or 'next_step', got {autoreset!r}")
        # RecordEpisodeStatistics and the trainer read the mode here
        self.metadata = {"autoreset_mode": AUTORESET_MODES[autoreset]}
        self.task = get_task(task)
        self.num_envs = num_envs
        self.temperature = float(temperature)
        self.missing_eos_penalty = missing_eos_penalty
        reference_dir = model_dir(self.task.name, "reference")
        # the models this task's numbers are computed with (the reward model scores every evaluation, whichever
        # reward trains): summary.json's task_models
        self.task_models = {what: weights_record(model_dir(self.task.name, what))
                            for what in ("reference", "reward_model")}
        self.tokenizer = PreTrainedTokenizerFast.from_pretrained(reference_dir)
        self.reference = GPT2LMHeadModel.from_pretrained(reference_dir).eval()
        self.reward_model = None
        if reward == "model":
            reward_dir = model_dir(self.task.name, "reward_model")
            self.reward_model = GPT2ForSequenceClassification.from_pretrained(reward_dir).eval()
            build = json.loads((reward_dir / "build.json").read_text())
            self.score_mean, self.score_std = build["score_mean"], build["score_std"]
        self.vocabulary = list(self.task.vocabulary)
        length = self.task.sequence_length
        self.single_observation_space = gym.spaces.Box(0, len(self.vocabulary) - 1, (length,), np.float32)
        self.single_action_space = gym.spaces.Discrete(len(self.vocabulary))
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.tokens = np.zeros((num_envs, length), np.int64)
        self.lengths = np.zeros(num_envs, np.int64)
        self.needs_reset = np.zeros(num_envs, bool)
        self.prompt_rng = np.random.default_rng()

    # -- episodes ------------------------------------------------------------

    def new_prompt(self, index: int) -> None:
        prompt = self.task.prompt(self.prompt_rng)
        ids = self.tokenizer.convert_tokens_to_ids(prompt)
        self.tokens[index] = 0
        self.tokens[index, :len(ids)] = ids
        self.lengths[index] = len(ids)

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.prompt_rng = np.random.default_rng(seed)
        for index in range(self.num_envs):
            self.new_prompt(index)
        self.needs_reset[:] = False
        return self.tokens.astype(np.float32), {}

    def prompt(self, index: int) -> list[str]:
        return [self.vocabulary[i] for i in self.tokens[index, :self.task.prompt_tokens]]

    def response(self, index: int) -> list[str]:
        return [self.vocabulary[i] for i in self.tokens[index, self.task.prompt_tokens:self.lengths[index]]]

    def scores(self, finished: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(reward, judge's score) of each finished response."""
        indices = np.flatnonzero(finished)
        judged = np.array([self.task.judge(self.prompt(i), self.response(i)) for i in indices])
        if self.reward_model is None:
            return judged, judged
        with torch.inference_mode():
            scored = reward_scores(self.reward_model, torch.as_tensor(self.tokens[indices])).numpy()
        return (scored.astype(np.float64) - self.score_mean) / self.score_std, judged

    # -- one token per env ---------------------------------------------------

    def step(self, actions):
        actions = np.asarray(actions, dtype=np.int64)
        num = self.num_envs
        rewards = np.zeros(num)
        terminated = np.zeros(num, bool)
        ref_log_prob = np.zeros(num, np.float32)
        judge = np.zeros(num)
        writing = ~self.needs_reset

        if writing.any():
            rows = np.flatnonzero(writing)
            with torch.inference_mode():
                log_probs = next_token_log_probs(self.reference, torch.as_tensor(self.tokens[rows]), self.temperature,
                                                 lengths=torch.as_tensor(self.lengths[rows]))
            ref_log_prob[rows] = log_probs[torch.arange(len(rows)), torch.as_tensor(actions[rows])].numpy()
            self.tokens[rows, self.lengths[rows]] = actions[rows]
            self.lengths[rows] += 1
            ended_with_eos = writing & (actions == EOS_ID)
            finished = writing & (ended_with_eos | (self.lengths == self.task.sequence_length))
            if finished.any():
                rewards[finished], judge[finished] = self.scores(finished)
                if self.missing_eos_penalty is not None:
                    rewards[finished & ~ended_with_eos] -= self.missing_eos_penalty
                terminated = finished
        info = {"ref_log_prob": ref_log_prob, "episode_metrics": {"judge": judge}, "_episode_metrics": terminated.copy()}
        if self.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP:
            info["final_obs"] = np.where(terminated[:, None], self.tokens, 0).astype(np.float32)
            info["_final_obs"] = terminated.copy()
            for index in np.flatnonzero(terminated):
                self.new_prompt(index)
            return self.tokens.astype(np.float32), rewards, terminated, np.zeros(num, bool), info
        for index in np.flatnonzero(self.needs_reset):
            self.new_prompt(index)
        self.needs_reset = terminated.copy()
        return self.tokens.astype(np.float32), rewards, terminated, np.zeros(num, bool), info

    # -- checkpoints (benchmarks/engine/env_state.py) ---------------------------

    def state_dict(self) -> dict:
        return {"tokens": self.tokens.copy(), "lengths": self.lengths.copy(), "needs_reset": self.needs_reset.copy(),
                "prompt_rng": self.prompt_rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        self.tokens, self.lengths = state["tokens"].copy(), state["lengths"].copy()
        self.needs_reset = state["needs_reset"].copy()
        self.prompt_rng.bit_generator.state = state["prompt_rng"]

    def decode(self, index: int) -> str:
        """The env's current sequence as text (tokens separated by spaces), for a reader."""
        return " ".join(self.vocabulary[i] for i in self.tokens[index, :self.lengths[index]])


def register() -> None:
    """The tasks as Gymnasium ids (namespace RLHF), made by gym.make_vec(id, num_envs, **kwargs)."""
    for name, id_name in (("arithmetic", "Arithmetic"), ("praise", "Praise")):
        env_id = f"RLHF/{id_name}-v0"
        if env_id not in gym.registry:
            gym.register(id=env_id, vector_entry_point="benchmarks.rlhf.env:TokenVectorEnv", kwargs={"task": name})


register()
