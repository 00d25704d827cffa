"""This suite's PPO beside TRL's PPOTrainer on the same token task, reference, reward model and budget.

    pip install -e ".[rlhf,trl]"
    python -m benchmarks.rlhf.trl_reference --task praise [--seed 0] [--samples 1024]

TRL dropped PPOTrainer after 1.12 (moved to trl.experimental.ppo in 1.10, removed in 1.13), so the
`trl` extra pins trl==1.12.0, the last release that has it; like Stable-Baselines3 it is only a
reference here, never a dependency of training.

Both trainers run in this one process, one after the other, so their speeds are a ratio measured side
by side (never compare the times across runs on a shared machine):

  ours  the config of `python run.py algo=ppo env=RLHF<Task> seed=<seed>` (the family's values),
        trained into a temporary directory
  TRL   PPOConfig with the same values wherever TRL has the key: learning rate, PPO epochs, clip,
        value-loss coefficient and clip, gamma, lambda, KL coefficient (per-token
        log-ratio, TRL's "k1"), reward whitening, temperature, response length, <eos> as the stop
        token, missing-<eos> penalty (TRL has a max_grad_norm key, but its PPO loop never clips); the
        same reward on both sides (a task whose env pays the judge, RLHFArithmetic, is trained here on
        its learnt reward model, as TRL is); the same policy start (the supervised reference), the same frozen
        reference, the same reward model with the same normalisation of its score, a value model
        from the reference with its head at 0 (as ours), and as many responses as our run wrote.

What cannot match, by design of the two trainers: TRL batches whole responses (64 prompts per rollout,
4 minibatches of 16 responses) where ours batches tokens (64 envs x 16 tokens, 4 minibatches of 256
tokens); TRL's optimizer is transformers' AdamW (eps 1e-8, a linear learning-rate decay) where ours is
Adam (eps 1e-5) with the same linear decay; ours clips the global gradient norm (max_grad_norm), TRL's
PPO loop does not; TRL adds the score one token after <eos> (its known off-by-one) and can
sample <pad> and <bos>, which ours never generates (algorithms/lm_policy.py).

Both final policies are then scored by one function (`score_policy`, the suite's own evaluation of token
tasks, benchmarks/rlhf/evaluation.py): responses sampled at the run's temperature to `--samples` prompts
from one fixed seed (the reward as the env pays it, the reward model's and the judge's score, the summed
per-token KL to the reference, the length), and greedy responses to 64 prompts. Writes
results/tables/rlhf_trl_<task>.md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from algorithms.lm_policy import CausalLMActorCritic
from benchmarks.engine.checkpoint import read_checkpoint
from benchmarks.engine.config import PROJECT_ROOT, compose_config, task_kwargs
from benchmarks.engine.envs import find_spec
from benchmarks.engine.logger import read_csv_complete_rows
from benchmarks.engine.trainer import train
from benchmarks.rlhf.evaluation import SampledEvaluation
from benchmarks.rlhf.models import model_dir, resolve_init_from
from benchmarks.rlhf.tasks import get_task

TASK_ENVS = {"arithmetic": "RLHFArithmetic", "praise": "RLHFPraise"}
TRL_VERSION = "1.12.0"


# -- one scorer for both policies --------------------------------------------------------------


def score_policy(actor, cfg, samples: int, seed: int, greedy: bool = False) -> dict:
    """Mean reward (as the env pays it), reward model's and judge's score, KL to the reference (summed over each
    response's tokens) and length of the responses of `actor` (a causal LM) to `samples` prompts drawn with
    `seed`: the suite's own evaluation of token tasks (benchmarks/rlhf/evaluation.py)."""
    evaluation = SampledEvaluation(get_task_name(cfg), samples, seed, **task_kwargs(cfg.env))
    scored = evaluation.responses(actor, greedy=greedy)
    evaluation.close()
    return {key: float(np.mean(values)) for key, values in scored.items()}


def get_task_name(cfg) -> str:
    """The task the config's env writes (env.network.init_from may be rlhf/<task> or a model directory)."""
    return find_spec(cfg.env.id).kwargs["task"]


# -- the two trainers -------------------------------------------------------------------------


def train_ours(cfg, run_dir: Path) -> dict:
    start = time.perf_counter()
    train(cfg, run_dir)
    seconds = time.perf_counter() - start
    episodes = read_csv_complete_rows(run_dir / "episodes.csv")  # the suite's one reader of run logs
    policy = CausalLMActorCritic(len(get_task(get_task_name(cfg)).vocabulary), resolve_init_from(cfg.env.network.init_from),
                                 cfg.env.network.temperature)
    policy.load_state_dict(read_checkpoint(run_dir / "checkpoint.pt")["algorithm"]["policy"])
    return {"actor": policy.actor.eval(), "seconds": seconds, "responses": len(episodes),
            "tokens": int(episodes["episode_length"].sum())}


class NormalisedScore(torch.nn.Module):
    """The reward model's head, scaled as the token env scales its score (mean 0, std 1 on the reference)."""

    def __init__(self, head: torch.nn.Module, mean: float, std: float):
        super().__init__()
        self.head, self.mean, self.std = head, mean, std

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return (self.head(hidden) - self.mean) / self.std


def trl_config(cfg, responses: int, out_dir: Path):
    from trl.experimental.ppo import PPOConfig

    hp, algo, task = cfg.env.hparams, cfg.algo, get_task(get_task_name(cfg))
    batch = int(cfg.env.num_envs)
    return PPOConfig(
        output_dir=str(out_dir), seed=int(cfg.seed), report_to="none", save_strategy="no", use_cpu=True,
        logging_steps=1, disable_tqdm=True, num_sample_generations=0,
        learning_rate=float(hp.lr), num_ppo_epochs=int(hp.update_epochs), num_mini_batches=int(hp.num_minibatches),
        per_device_train_batch_size=batch, local_rollout_forward_batch_size=batch, total_episodes=responses,
        cliprange=float(hp.clip_coef), cliprange_value=float(hp.clip_coef) if algo.clip_vloss else 1e9,
        vf_coef=float(algo.vf_coef), max_grad_norm=float(algo.max_grad_norm),
        gamma=float(hp.gamma), lam=float(hp.gae_lambda),
        kl_coef=float(cfg.env.kl_penalty.coef), kl_estimator="k1", whiten_rewards=bool(cfg.env.whiten_rewards),
        temperature=float(cfg.env.network.temperature), response_length=task.max_new_tokens, stop_token="eos",
        missing_eos_penalty=cfg.env.kwargs.missing_eos_penalty,
    )


def train_trl(cfg, responses: int, out_dir: Path) -> dict:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, PreTrainedTokenizerFast
    from trl.experimental.ppo import PPOTrainer

    if cfg.env.kl_penalty.adaptive:
        raise SystemExit("TRL's PPOTrainer (1.12) has a fixed KL coefficient only: run with env.kl_penalty.adaptive=false")
    task_name = get_task_name(cfg)
    task, reference_dir, reward_dir = get_task(task_name), model_dir(task_name, "reference"), model_dir(task_name, "reward_model")
    start_dir = resolve_init_from(cfg.env.network.init_from)  # where ours starts, policy and value body alike
    torch.manual_seed(int(cfg.seed))
    tokenizer = PreTrainedTokenizerFast.from_pretrained(reference_dir)
    policy = AutoModelForCausalLM.from_pretrained(start_dir)
    reference = AutoModelForCausalLM.from_pretrained(reference_dir)  # the KL's reference: the task's, as ours
    value_model = AutoModelForSequenceClassification.from_pretrained(start_dir, num_labels=1)
    torch.nn.init.zeros_(value_model.score.weight)  # ours starts its value head at 0
    reward_model = AutoModelForSequenceClassification.from_pretrained(reward_dir)
    build = json.loads((reward_dir / "build.json").read_text())
    reward_model.score = NormalisedScore(reward_model.score, build["score_mean"], build["score_std"])
    rng = np.random.default_rng(int(cfg.seed))
    prompts = [tokenizer.convert_tokens_to_ids(task.prompt(rng)) for _ in range(4096)]
    dataset = Dataset.from_dict({"input_ids": prompts})
    trainer = PPOTrainer(args=trl_config(cfg, responses, out_dir), processing_class=tokenizer, model=policy,
                         ref_model=reference, reward_model=reward_model, value_model=value_model,
                         train_dataset=dataset, eval_dataset=dataset.select(range(64)))
    threads = torch.get_num_threads()
    torch.set_num_threads(int(cfg.torch_threads) if cfg.get("torch_threads") else threads)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    torch.set_num_threads(threads)
    log = [row for row in trainer.state.log_history if "objective/scores" in row]
    batches = len(log)
    return {"actor": policy.eval(), "seconds": seconds, "responses": batches * int(cfg.env.num_envs),
            "last_rollouts_score": float(np.mean([row["objective/scores"] for row in log[-10:]])),
            "last_rollouts_kl": float(np.mean([row["objective/kl"] for row in log[-10:]]))}


# -- the comparison ---------------------------------------------------------------------------


def compare(task: str, seed: int, samples: int, overrides: list[str]) -> dict:
    # TRL's PPOTrainer trains on a reward model; a task whose env pays the judge (RLHFArithmetic) is trained here
    # on the same learnt reward model, so that both sides optimise one objective (both are scored on both).
    same_reward = ([] if compose_config([f"env={TASK_ENVS[task]}"]).env.kwargs.reward == "model"
                   else ["env.kwargs.reward=model"])
    if same_reward:
        print(f"{TASK_ENVS[task]} pays the judge by default; both trainers optimise its learnt reward model here "
              f"(env.kwargs.reward=model), the one TRL's PPOTrainer takes", flush=True)
    cfg = compose_config([f"env={TASK_ENVS[task]}", "algo=ppo", f"seed={seed}", "logging.tensorboard=false",
                          "logging.progress_bar=false", *same_reward, *overrides])
    with tempfile.TemporaryDirectory() as tmp:
        print(f"training ours: ppo on {TASK_ENVS[task]}, seed {seed}, {cfg.total_steps} generated tokens", flush=True)
        ours = train_ours(cfg, Path(tmp) / "ours")
        print(f"training TRL {TRL_VERSION} PPOTrainer on the same task: {ours['responses']} responses", flush=True)
        theirs = train_trl(cfg, ours["responses"], Path(tmp) / "trl")
    reference = CausalLMActorCritic(len(get_task(task).vocabulary), resolve_init_from(cfg.env.network.init_from),
                                    cfg.env.network.temperature).actor.eval()
    rows = {}
    for name, actor, run in (("reference (before training)", reference, None), ("ours", ours["actor"], ours),
                             (f"TRL {TRL_VERSION}", theirs["actor"], theirs)):
        sampled = score_policy(actor, cfg, samples, seed=10_000 + seed)
        greedy = score_policy(actor, cfg, 64, seed=20_000 + seed, greedy=True)
        rows[name] = {**{f"sampled_{k}": v for k, v in sampled.items()}, "greedy_judge": greedy["judge"],
                      "greedy_reward": greedy["reward"],
                      **({"train_seconds": run["seconds"], "responses": run["responses"],
                          "responses_per_second": run["responses"] / run["seconds"]} if run else {})}
    return {"task": task, "env": TASK_ENVS[task], "seed": seed, "samples": samples, "overrides": overrides,
            "trl_version": TRL_VERSION, "ours_tokens": ours["tokens"],
            "trl_last_10_rollouts": {"score": theirs["last_rollouts_score"], "kl": theirs["last_rollouts_kl"]},
            "rows": rows}


def markdown(result: dict, command: str) -> str:
    lines = [f"# {result['env']}: this suite's PPO and TRL {result['trl_version']}'s PPOTrainer, side by side",
             "", f"`{command}` (seed {result['seed']}, both trainers in one process, one after the other; "
             f"our run wrote {result['responses_ours']} responses ({result['ours_tokens']} tokens), TRL got as many "
             "responses). Scores of the final policies by one scorer: "
             f"{result['samples']} sampled responses (temperature as trained) and 64 greedy ones, fixed prompts.", "",
             "| policy | reward model (sampled) | judge (sampled) | KL to reference (nats/response) | length "
             "| judge (greedy) | train time (s) | responses/s |", "|---|---|---|---|---|---|---|---|"]
    for name, row in result["rows"].items():
        time_cells = (f"{row['train_seconds']:.0f} | {row['responses_per_second']:.1f}" if "train_seconds" in row
                      else "- | -")
        lines.append(f"| {name} | {row['sampled_reward']:.2f} | {row['sampled_judge']:.2f} "
                     f"| {row['sampled_kl_to_reference']:.2f} | {row['sampled_length']:.1f} "
                     f"| {row['greedy_judge']:.2f} | {time_cells} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=sorted(TASK_ENVS), required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--samples", type=int, default=1024, help="sampled responses scored per policy")
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "results" / "tables")
    parser.add_argument("overrides", nargs="*", help="config overrides for both trainers, e.g. total_steps=16384")
    args = parser.parse_args(argv)
    try:
        import trl
    except ImportError:
        print('TRL is not installed: pip install -e ".[trl]"', file=sys.stderr)
        return 2
    if trl.__version__ != TRL_VERSION:
        print(f"this comparison needs trl=={TRL_VERSION} (PPOTrainer was removed after it); found {trl.__version__}",
              file=sys.stderr)
        return 2
    result = compare(args.task, args.seed, args.samples, args.overrides)
    result["responses_ours"] = result["rows"]["ours"]["responses"]
    command = " ".join(["python -m benchmarks.rlhf.trl_reference", *(argv if argv is not None else sys.argv[1:])])
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"rlhf_trl_{args.task}"
    Path(f"{stem}.json").write_text(json.dumps({"command": command, **result}, indent=2) + "\n")
    Path(f"{stem}.md").write_text(markdown(result, command))
    print(Path(f"{stem}.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
