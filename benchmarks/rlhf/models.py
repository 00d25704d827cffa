"""The RLHF tasks' models, built by committed code and cached: tokenizer, reference model, reward model.

    python -m benchmarks.rlhf.models --task praise        # builds what is missing, prints where it is
    python -m benchmarks.rlhf.models --ship               # after a change to a task or a build: into git

Everything is a Hugging Face `transformers` object, so the same code loads a real checkpoint
(`from_pretrained` on any GPT-2-style directory) when one is at hand:

    tokenizer        a word-level `PreTrainedTokenizerFast` over the task's vocabulary (tokens are
                     separated by spaces in text: "<bos> 7 + 5 =")
    reference model  a `GPT2LMHeadModel` (2 layers, 32 wide) fine-tuned on the task's corpus, loss
                     on the response tokens only (supervised fine-tuning); the RL policy starts
                     from it and the KL penalty measures the distance to it
    reward model     a `GPT2ForSequenceClassification` with one output, trained on pairs of responses
                     to the same prompt, the preferred one chosen by the task's labeller, with the
                     Bradley-Terry loss -log sigmoid(r(chosen) - r(rejected)) (Christiano et al. 2017;
                     Ouyang et al. 2022); it scores the last non-padding token. Its scores on the
                     reference's responses to held-out prompts give the mean and std the env normalises by

Built deterministically (fixed seeds, one thread) in one to three minutes each on one core. The
builds the committed runs used ship in the repository (benchmarks/rlhf/shipped/<task>/<what>-<fingerprint>/);
the fingerprint hashes the recipe, the model size, the source code of the build and the task's definition
(task_definition: its classes and the word lists and helpers they read), so a change to any of them names a
model that is not shipped: it is built into
`.cache/rlhf/<task>/` (RLHF_CACHE overrides the root), parallel jobs that need it waiting on a file
lock while the first builds it, and `--ship` copies it into the repository. Dropout is 0 in every model: the PPO
ratio compares log-probabilities of the same network before and after an update.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import inspect
import json
import os
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from transformers.utils import logging as transformers_logging

from algorithms.lm_policy import padding_mask
from benchmarks.engine.run_dir import file_sha256
from benchmarks.rlhf.tasks import BOS, EOS, PAD, TASKS, Task, get_task

transformers_logging.disable_progress_bar()  # "Loading weights" bars on every model load

REPOSITORY = Path(__file__).resolve().parents[2]
RECIPE_VERSION = 3  # raise when the build changes in a way the fingerprint's inputs do not show (a shared helper)

MODEL_SIZE = {"n_embd": 32, "n_layer": 2, "n_head": 2}
REFERENCE_TRAINING = {"examples": 20000, "steps": 1500, "batch_size": 128, "lr": 3e-3, "seed": 0}
REWARD_TRAINING = {"pairs": 20000, "steps": 1500, "batch_size": 128, "lr": 3e-3, "seed": 1, "held_out": 2000}


# The builds the committed runs used, in the repository (about 130 KB each): a fresh clone trains at once, and
# the same weights on every machine (a rebuild is byte-identical on one machine, but float kernels may differ
# across CPUs). `python -m benchmarks.rlhf.models --ship` replaces them after a change to a task or a build.
SHIPPED = Path(__file__).resolve().parent / "shipped"


def cache_root() -> Path:
    return Path(os.environ.get("RLHF_CACHE", REPOSITORY / ".cache" / "rlhf"))


def fingerprint(*parts) -> str:
    return hashlib.sha256(json.dumps([RECIPE_VERSION, *parts], sort_keys=True).encode()).hexdigest()[:12]


# ---------------------------------------------------------------------------
# tokenizer and model configs
# ---------------------------------------------------------------------------


def build_tokenizer(task: Task):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocabulary = {token: index for index, token in enumerate(task.vocabulary)}
    core = Tokenizer(models.WordLevel(vocabulary, unk_token=PAD))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                   model_max_length=task.sequence_length)


def gpt2_config(task: Task, **extra):
    from transformers import GPT2Config

    return GPT2Config(vocab_size=len(task.vocabulary), n_positions=task.sequence_length, **MODEL_SIZE,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, summary_first_dropout=0.0,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0, **extra)


def reward_scores(model, ids: torch.Tensor) -> torch.Tensor:
    """The reward model's raw score of each right-padded sequence (read at its last non-padding token)."""
    return model(input_ids=ids, attention_mask=padding_mask(ids)).logits.squeeze(-1)


def encode(tokenizer, tokens: list[str]) -> list[int]:
    return tokenizer.convert_tokens_to_ids(tokens)


def padded(rows: list[list[int]], length: int) -> torch.Tensor:
    """Right-padded with <pad> (id 0): every model here reads left to right and masks the padding."""
    out = torch.zeros((len(rows), length), dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, :len(row)] = torch.tensor(row)
    return out


# ---------------------------------------------------------------------------
# builds
# ---------------------------------------------------------------------------


@contextmanager
def one_thread_seeded(seed: int):
    """A build's own seed and one thread; the process's torch stream is restored after, so that a run which
    builds a model on its first start draws the same numbers as a run that finds it in the cache."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            yield np.random.default_rng(seed)
        finally:
            torch.set_num_threads(threads)


def train_reference(task: Task, tokenizer, out_dir: Path) -> dict:
    """Supervised fine-tuning on the task's corpus (the reference's own answers, task.reference_response)."""
    from transformers import GPT2LMHeadModel

    recipe = REFERENCE_TRAINING
    with one_thread_seeded(recipe["seed"]) as rng:
        prompts = [task.prompt(rng) for _ in range(recipe["examples"])]
        sequences = [encode(tokenizer, p + task.reference_response(p, rng)) for p in prompts]
        ids = padded(sequences, task.sequence_length)
        labels = ids.clone()
        labels[:, :task.prompt_tokens] = -100             # the loss is on the response only
        labels[ids == 0] = -100                           # and not on padding
        mask = (ids != 0).long()
        model = GPT2LMHeadModel(gpt2_config(task))
        optimizer = torch.optim.AdamW(model.parameters(), lr=recipe["lr"])
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / recipe["steps"])
        for step in range(recipe["steps"]):
            batch = torch.as_tensor(rng.integers(0, len(ids), recipe["batch_size"]))
            loss = model(input_ids=ids[batch], attention_mask=mask[batch], labels=labels[batch]).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
        model.eval()
        model.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
    return {"final_training_loss": float(loss)}


def train_reward_model(task: Task, tokenizer, out_dir: Path) -> dict:
    """Bradley-Terry on the labeller's preferences between two responses to one prompt (ties dropped)."""
    from transformers import GPT2ForSequenceClassification

    recipe = REWARD_TRAINING
    with one_thread_seeded(recipe["seed"]) as rng:
        chosen, rejected = [], []
        while len(chosen) < recipe["pairs"] + recipe["held_out"]:
            prompt = task.prompt(rng)
            first, second = task.preference_response(prompt, rng), task.preference_response(prompt, rng)
            first_score, second_score = task.labeller(prompt, first), task.labeller(prompt, second)
            if first_score == second_score:
                continue
            if first_score < second_score:
                first, second = second, first
            chosen.append(encode(tokenizer, prompt + first))
            rejected.append(encode(tokenizer, prompt + second))
        chosen_ids, rejected_ids = padded(chosen, task.sequence_length), padded(rejected, task.sequence_length)
        train, held_out = slice(0, recipe["pairs"]), slice(recipe["pairs"], None)
        model = GPT2ForSequenceClassification(gpt2_config(task, num_labels=1))

        def scores(ids: torch.Tensor) -> torch.Tensor:
            return reward_scores(model, ids)

        optimizer = torch.optim.AdamW(model.parameters(), lr=recipe["lr"])
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / recipe["steps"])
        for step in range(recipe["steps"]):
            batch = torch.as_tensor(rng.integers(0, recipe["pairs"], recipe["batch_size"]))
            margin = scores(chosen_ids[train][batch]) - scores(rejected_ids[train][batch])
            loss = -torch.nn.functional.logsigmoid(margin).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
        model.eval()
        with torch.inference_mode():
            accuracy = float((scores(chosen_ids[held_out]) > scores(rejected_ids[held_out])).float().mean())
            # Normalised so that the reference's own responses score mean 0, std 1 (Ziegler et al. 2019):
            # the scale the KL coefficient is set against, whatever scale the Bradley-Terry fit ended at.
            prompts = [task.prompt(rng) for _ in range(recipe["held_out"])]
            reference_ids = padded([encode(tokenizer, p + task.reference_response(p, rng)) for p in prompts],
                                   task.sequence_length)
            reference_scores = scores(reference_ids)
        model.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
    return {"final_training_loss": float(loss), "held_out_pairs": recipe["held_out"],
            "held_out_accuracy": accuracy, "score_mean": float(reference_scores.mean()),
            "score_std": float(reference_scores.std())}


BUILDS = {
    "reference": (train_reference, REFERENCE_TRAINING),
    "reward_model": (train_reward_model, REWARD_TRAINING),
}


def task_definition(task: Task) -> list[str]:
    """What defines a task, as text: the source of its class and of the classes it inherits from in its module
    (Task's labeller and preferences), and of each module-level name their code reads, by source (a helper) or by
    value (the word lists a judge scores by), followed through the helpers' own code."""
    module = sys.modules[type(task).__module__]
    classes = [cls for cls in type(task).__mro__ if cls.__module__ == module.__name__]
    parts, seen, pending = [], set(), []

    def read_by(code) -> None:  # the global names a function's code (and the code nested in it) reads
        pending.extend(code.co_names)
        for constant in code.co_consts:
            if inspect.iscode(constant):
                read_by(constant)

    for cls in classes:
        for attribute in vars(cls).values():
            function = inspect.unwrap(getattr(attribute, "__func__", getattr(attribute, "fget", attribute)))
            if inspect.isfunction(function):
                read_by(function.__code__)
    while pending:
        name = pending.pop()
        value = vars(module).get(name)
        if name in seen or value is None or inspect.ismodule(value) or any(value is cls for cls in classes):
            continue
        seen.add(name)
        if inspect.isfunction(value) or inspect.isclass(value):
            if getattr(value, "__module__", None) == module.__name__:  # an imported one is its library's
                parts.append(inspect.getsource(value))
                if inspect.isfunction(value):
                    read_by(value.__code__)
        else:
            parts.append(f"{name} = {literal_text(name, value)}")
    return [inspect.getsource(cls) for cls in classes] + sorted(parts)


def literal_text(name: str, value) -> str:
    """A task's module-level value as text that is the same in every process: its repr, a set's sorted; literals
    only (an object's repr can hold its address, a set inside a container the hash seed's order)."""
    def literal(item, top: bool) -> bool:
        if isinstance(item, (set, frozenset)):
            return top and all(literal(element, False) for element in item)
        if isinstance(item, (tuple, list)):
            return all(literal(element, False) for element in item)
        if isinstance(item, dict):
            return all(literal(k, False) and literal(v, False) for k, v in item.items())
        return isinstance(item, (str, int, float, bool))

    if not literal(value, True):
        raise TypeError(f"the task module's {name} is not a literal ({type(value).__name__}): a value a task reads "
                        f"must be str, numbers, tuples, lists, dicts of them (or a set of them) for its models' "
                        f"fingerprint")
    return repr(sorted(value)) if isinstance(value, (set, frozenset)) else repr(value)


def build_name(task_name: str, what: str) -> str:
    """<what>-<fingerprint>: the fingerprint hashes the task's definition (task_definition: its corpus,
    labeller and judge, the word lists they read) and the source of the build, so a change to either names a
    new model."""
    task = get_task(task_name)
    build, recipe = BUILDS[what]
    key = fingerprint(task.name, list(task.vocabulary), task.sequence_length, MODEL_SIZE, what, recipe,
                      task_definition(task), inspect.getsource(build))
    return f"{what}-{key}"


def model_dir(task_name: str, what: str) -> Path:
    """The model's directory: the shipped build if its fingerprint is current, else the cached one, built
    first if it is not there (under a lock: one builder at a time)."""
    task = get_task(task_name)
    build, recipe = BUILDS[what]
    name = build_name(task_name, what)
    if (SHIPPED / task.name / name / "build.json").exists():
        return SHIPPED / task.name / name
    out_dir = cache_root() / task.name / name
    if (out_dir / "build.json").exists():
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(out_dir.parent / f".{what}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out_dir / "build.json").exists():  # another process may have built it while this one waited
            print(f"building the {task.name} task's {what.replace('_', ' ')} into {out_dir} (once; one to three "
                  f"minutes; --ship puts it in the repository)", file=sys.stderr)
            started = time.perf_counter()
            partial = out_dir.with_name(out_dir.name + ".partial")
            partial.mkdir(exist_ok=True)
            facts = build(task, build_tokenizer(task), partial)
            facts.update({"task": task.name, "what": what, "recipe": recipe, "model_size": MODEL_SIZE,
                          "seconds": round(time.perf_counter() - started, 1),
                          "torch": torch.__version__})
            (partial / "build.json").write_text(json.dumps(facts, indent=2) + "\n")
            partial.rename(out_dir)
    return out_dir


def weights_record(directory: Path) -> dict:
    """A model as a run read it: its build name and the sha256 of its weights. Builds of one fingerprint made on
    another machine, in another numerics mode or by older code can hold other weights; a run's summary.json keeps
    this record of the task's models (`task_models`) so that benchmarks.reproduce names such a difference."""
    return {"name": directory.name, "sha256": file_sha256(directory / "model.safetensors")}


def resolve_init_from(init_from: str) -> str:
    """env.network.init_from as a model directory: rlhf/<task> is that task's cached reference model (built on
    first use); anything else is a directory already."""
    if init_from.startswith("rlhf/"):
        return str(model_dir(init_from.removeprefix("rlhf/"), "reference"))
    return init_from


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rlhf.models", description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=sorted(TASKS) + ["all"], default="all")
    parser.add_argument("--ship", action="store_true",
                        help=f"build into the cache and copy into {SHIPPED.relative_to(REPOSITORY)}/ (for git), "
                             "replacing older shipped builds of the same model")
    args = parser.parse_args(argv)
    for name in sorted(TASKS) if args.task == "all" else [args.task]:
        for what in BUILDS:
            path = model_dir(name, what)
            if args.ship and not path.is_relative_to(SHIPPED):
                for old in (SHIPPED / name).glob(f"{what}-*"):
                    shutil.rmtree(old)
                path = Path(shutil.copytree(path, SHIPPED / name / path.name))
            facts = json.loads((path / "build.json").read_text())
            extra = f", held-out preference accuracy {facts['held_out_accuracy']:.3f}" if "held_out_accuracy" in facts else ""
            print(f"{name} {what}: {path}{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
