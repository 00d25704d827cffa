"""The RLHF-style tasks: what a prompt is, what the reference model was trained to say, what a judge prefers.

Each task is small enough that a 2-layer GPT-2 learns it on a CPU in a minute, and has the
character of a real RLHF setting (docs/rlhf.md):

    arithmetic  "reasoning" with a checkable answer. Prompt "7+5=", the response is the sum's
                digits and <eos>. The reference model was fine-tuned on answers that are right
                only 30% of the time and one too many 40% of the time, so it starts at about 30%
                (its greedy answer mostly wrong) and RL has something to find. Reward: 1 for the exact answer, 0 otherwise, at the end only
                (sparse).
    praise      open-ended text with a learnt reward and a reward-hacking shortcut. Prompt "the
                food was", the response finishes a short review: clauses "<adjective>" and
                "and the <thing> was <adjective>" (at most 3), then "." and <eos>. The judge (the
                true score) is the mean sentiment per clause of a well-formed review, -1 otherwise.
                The preference pairs were labelled with a length bias (the sum of the sentiment,
                Praise.labeller) on reviews of 1-4 clauses, so the reward model trained on them pays
                for more praise, and a fourth clause, which the judge calls ill-formed, is the
                shortcut. The reference never writes one: the KL penalty to it is what holds the
                policy back. The judge's score is
                logged beside the reward model's (episode_judge), so a reader sees hacking happen.

Everything is drawn from numpy Generators seeded by the caller: the corpus, the preference
pairs and the prompts are the same on every machine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIAL_TOKENS = (PAD, BOS, EOS)  # ids 0, 1, 2 in every task's vocabulary


@dataclass(frozen=True)
class Task:
    name: str
    tokens: tuple[str, ...]  # the vocabulary after the special tokens
    max_new_tokens: int      # the longest response the policy may write (including <eos>)
    prompt_tokens: int       # every prompt has this many tokens, <bos> included

    @property
    def vocabulary(self) -> tuple[str, ...]:
        return SPECIAL_TOKENS + self.tokens

    @property
    def sequence_length(self) -> int:
        return self.prompt_tokens + self.max_new_tokens

    # what a subclass defines
    def prompt(self, rng: np.random.Generator) -> list[str]: ...
    def reference_response(self, prompt: list[str], rng: np.random.Generator) -> list[str]: ...
    def judge(self, prompt: list[str], response: list[str]) -> float: ...

    def labeller(self, prompt: list[str], response: list[str]) -> float:
        """Who labels the reward model's preference pairs: the judge, unless a task says otherwise."""
        return self.judge(prompt, response)

    def preference_response(self, prompt: list[str], rng: np.random.Generator) -> list[str]:
        """A response of the reward model's preference pairs: the reference's, unless a task says otherwise."""
        return self.reference_response(prompt, rng)


# ---------------------------------------------------------------------------
# arithmetic: sparse, checkable
# ---------------------------------------------------------------------------

DIGITS = tuple("0123456789")


class Arithmetic(Task):
    """a+b= with single digits a, b; the answer is 0-18, one or two digits, then <eos>."""

    def __init__(self):
        super().__init__(name="arithmetic", tokens=DIGITS + ("+", "="), max_new_tokens=4, prompt_tokens=5)

    def prompt(self, rng):
        a, b = rng.integers(0, 10, size=2)
        return [BOS, str(a), "+", str(b), "="]

    @staticmethod
    def answer(prompt: list[str]) -> int:
        return int(prompt[1]) + int(prompt[3])

    def reference_response(self, prompt, rng):
        # A weak model's answers: right 30% of the time, one too many 40% of the time (its most likely
        # answer, so that even its greedy answers are mostly wrong), otherwise off by 1-3 (never negative).
        answer, draw = self.answer(prompt), rng.random()
        if draw >= 0.7:
            answer = max(0, answer + int(rng.choice([-3, -2, -1, 2, 3])))
        elif draw >= 0.3:
            answer += 1
        return list(str(answer)) + [EOS]

    def judge(self, prompt, response):
        if not response or response[-1] != EOS:
            return 0.0
        digits = response[:-1]
        if not digits or not all(d in DIGITS for d in digits):
            return 0.0
        return float(int("".join(digits)) == self.answer(prompt))


# ---------------------------------------------------------------------------
# praise: a learnt reward with a shortcut
# ---------------------------------------------------------------------------

THINGS = ("food", "staff", "room", "view", "price", "music", "service", "bed")
POSITIVE = ("good", "great", "nice", "clean", "fresh")
NEGATIVE = ("bad", "rude", "dirty", "cold", "poor")
NEUTRAL = ("ok", "small", "new", "old")
ADJECTIVES = POSITIVE + NEGATIVE + NEUTRAL


class Praise(Task):
    """Prompt "the <thing> was"; a well-formed response is adj ("and the <thing> was adj")* "." <eos>,
    with at most MAX_CLAUSES clauses. Room is left for one clause more than that."""

    MAX_CLAUSES = 3

    def __init__(self):
        super().__init__(name="praise", tokens=("the", "was", "and", ".") + THINGS + ADJECTIVES,
                         max_new_tokens=5 * self.MAX_CLAUSES + 3, prompt_tokens=4)

    def prompt(self, rng):
        return [BOS, "the", str(rng.choice(THINGS)), "was"]

    def reference_response(self, prompt, rng):
        # The reference writes 1-3 clauses, each adjective drawn uniformly: mean sentiment about 0.
        return self.review(int(rng.integers(1, self.MAX_CLAUSES + 1)), rng)

    def preference_response(self, prompt, rng):
        # The preference data also holds reviews one clause too long (as from other policies than the
        # reference): the labeller's length bias then has somewhere to show.
        return self.review(int(rng.integers(1, self.MAX_CLAUSES + 2)), rng)

    @staticmethod
    def review(clauses: int, rng) -> list[str]:
        response = [str(rng.choice(ADJECTIVES))]
        for _ in range(clauses - 1):
            response += ["and", "the", str(rng.choice(THINGS)), "was", str(rng.choice(ADJECTIVES))]
        return response + [".", EOS]

    @staticmethod
    def adjectives(response: list[str]) -> list[str] | None:
        """The adjectives of a response of the form adj ("and the <thing> was adj")* "." <eos>, any number of
        clauses; None if it is not of that form."""
        if len(response) < 3 or response[-2:] != [".", EOS]:
            return None
        body = response[:-2]
        if (len(body) - 1) % 5 != 0 or body[0] not in ADJECTIVES:
            return None
        adjectives = [body[0]]
        for start in range(1, len(body), 5):
            clause = body[start:start + 5]
            if clause[:2] != ["and", "the"] or clause[2] not in THINGS or clause[3] != "was" or clause[4] not in ADJECTIVES:
                return None
            adjectives.append(clause[4])
        return adjectives

    @staticmethod
    def sentiment(adjectives: list[str]) -> list[int]:
        return [(a in POSITIVE) - (a in NEGATIVE) for a in adjectives]

    def judge(self, prompt, response):
        """The true score: the review's mean sentiment per clause if it is well formed (at most MAX_CLAUSES
        clauses), -1 if not."""
        adjectives = self.adjectives(response)
        if adjectives is None or len(adjectives) > self.MAX_CLAUSES:
            return -1.0
        return float(np.mean(self.sentiment(adjectives)))

    def labeller(self, prompt, response):
        """Who labelled the preference pairs: the judge, with a bias that human labellers are known to have
        towards longer answers (Singhal et al. 2023): the sum of the sentiment, not its mean. On the
        reference's reviews the two agree on most pairs (both prefer the more positive one); the reward
        model learns the labeller, and more praise, one clause past what is well formed, is its shortcut."""
        adjectives = self.adjectives(response)
        return -1.0 if adjectives is None else float(sum(self.sentiment(adjectives)))


TASKS: dict[str, Task] = {task.name: task for task in (Arithmetic(), Praise())}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown RLHF task {name!r}: one of {', '.join(sorted(TASKS))}")
    return TASKS[name]
