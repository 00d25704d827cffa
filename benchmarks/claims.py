"""What the papers claim next to what this suite measured: probability of improvement over PPO with 95% CIs.

    python -m benchmarks.claims                      # the tuned suites (TUNED_SUITES under results/runs)
    python -m benchmarks.claims SUITE_DIR ... --out results/tables --name claims_untuned

Writes results/tables/claims.md and claims.csv. Scores are raw returns per
task: the probability of improvement compares runs within a task and then
averages over tasks, so no normalisation is needed. The report's aggregate
(benchmarks.report) normalises each task by one rule, which leaves the
probability of improvement as it is: on the same tasks and seeds it gives the
same numbers (tests/test_report.py holds the MuJoCo suite to it). Tasks enter a group only where both PPO and the candidate have at least 3
complete seeds, and each group uses the first k seeds, k the smallest seed
count among its tasks (rliable's stratified bootstrap needs equal runs per task).

Each verdict says how both sides were tuned (benchmarks/tuning.py): a run counts
as tuned when every value of its family's best trial is the value it ran with;
tasks marked * were tuning tasks (the final evaluation uses other seeds).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.report import RESULTS
from benchmarks.statistics import area_under_curve, probability_of_improvement
from benchmarks.runs import eval_curves, existing_directory, group_runs, load_runs
from benchmarks.tuning import study_provenance

# A claim's task group, from each task's own family (env.family of its runs: conf/env_family/<family>.yaml), so a
# task added under a family lands in its group with no list to update. classic_continuous is classic control
# with continuous actions; every MuJoCo task is continuous; the token tasks (docs/rlhf.md) are a group of their own.
GROUP_FAMILIES = {"mujoco": {"mujoco"}, "continuous": {"mujoco", "classic_continuous"}, "rlhf": {"rlhf"},
                  "discrete": {"classic"}}
# The final evaluations of the tuning (docs/tuning.md), each on its family's tuned values; those present are read.
TUNED_SUITES = ("mujoco_tuned_300k", "classic_tuned", "rlhf")
MIN_SEEDS = 3  # a task enters a comparison only with at least this many seeds of both algorithms

# (paper, what it claims, preset, task group, metric)
CLAIMS = [
    ("Outer-PPO", "outer lr sigma > 1 beats tuned PPO (Brax, Jumanji)", "outer_ppo_lr", "mujoco", "final"),
    ("Outer-PPO", "outer lr sigma > 1: no gain on discrete MinAtar", "outer_ppo_lr", "discrete", "final"),
    ("Outer-PPO", "outer Nesterov momentum beats tuned PPO (Brax, Jumanji)", "outer_ppo_nesterov", "mujoco", "final"),
    ("Outer-PPO", "outer Nesterov momentum: no gain on discrete MinAtar", "outer_ppo_nesterov", "discrete", "final"),
    ("Outer-PPO", "biased inner start beats tuned PPO (Brax, Jumanji)", "outer_ppo_biased", "mujoco", "final"),
    ("Outer-PPO", "biased inner start: no gain on discrete MinAtar", "outer_ppo_biased", "discrete", "final"),
    ("(user default)", "inner SGD lr 1 + outer AdamW: not a paper claim", "outer_ppo", "mujoco", "final"),
    ("(user default)", "inner SGD lr 1 + outer AdamW: not a paper claim", "outer_ppo", "discrete", "final"),
    ("HP3O", "better sample efficiency than PPO on continuous control", "hp3o", "continuous", "auc"),
    ("HP3O", "lower variance across seeds than PPO on continuous control", "hp3o", "continuous", "std"),
    ("HP3O", "final return (not claimed; for context)", "hp3o", "continuous", "final"),
    ("HP3O+", "better sample efficiency than PPO on continuous control", "hp3o_plus", "continuous", "auc"),
    ("HP3O+", "lower variance across seeds than PPO on continuous control", "hp3o_plus", "continuous", "std"),
    ("HP3O+", "final return (not claimed; for context)", "hp3o_plus", "continuous", "final"),
    # Where both papers place their motivation: RLHF, with costly trajectories (docs/rlhf.md)
    ("Outer-PPO", "outer lr sigma > 1 beats PPO (RLHF-style token tasks)", "outer_ppo_lr", "rlhf", "final"),
    ("Outer-PPO", "outer Nesterov momentum beats PPO (RLHF-style token tasks)", "outer_ppo_nesterov", "rlhf", "final"),
    ("Outer-PPO", "biased inner start beats PPO (RLHF-style token tasks)", "outer_ppo_biased", "rlhf", "final"),
    ("(user default)", "inner SGD lr 1 + outer AdamW: not a paper claim", "outer_ppo", "rlhf", "final"),
    ("HP3O", "better sample efficiency than PPO (RLHF-style token tasks)", "hp3o", "rlhf", "auc"),
    ("HP3O+", "better sample efficiency than PPO (RLHF-style token tasks)", "hp3o_plus", "rlhf", "auc"),
]
METRIC_TEXT = {
    "final": "P(final eval return > PPO's)",
    "auc": "P(area under eval curve > PPO's)",
    "std": "seed std of final return / PPO's (geometric mean over tasks; < 1 = lower variance)",
}


def task_families(runs: list[dict]) -> dict[str, str]:
    """task -> its family, as its runs' configs record it."""
    return {run["env"]: run["config"]["env"]["family"] for run in runs}


def in_group(family: str, group: str) -> bool:
    return family in GROUP_FAMILIES[group]


def per_seed_scores(runs: list[dict], metric: str) -> dict[tuple[str, str], np.ndarray]:
    """(task, algo) -> scores of seeds 0, 1, ... in seed order (final eval return or AUC)."""
    scores = {}
    for key, group in group_runs(runs).items():
        curves = eval_curves(group)
        if metric == "auc":
            scores[key] = np.array([area_under_curve(curves[seed]) for seed in curves.columns])
        else:
            scores[key] = curves.iloc[-1].to_numpy()
    return scores


def sampled_or_not_a_token_task(run: dict) -> bool:
    """False for a token-task run evaluated greedily (env.evaluation.kind, docs/rlhf.md): greedy responses
    saturate, every preset scoring alike, so the claims on token tasks read the sampled evaluation only. Runs stored
    before the sampled evaluation existed were greedy (with_later_keys fills the key with what they ran)."""
    if run["config"]["env"].get("family") != "rlhf":
        return True
    from benchmarks.engine.trainer import with_later_keys  # imported here: the trainer loads torch

    return with_later_keys(run["config"])["env"]["evaluation"]["kind"] == "sampled"


def measure(runs: list[dict], candidate: str, group: str, metric: str) -> dict | None:
    runs = [run for run in runs if sampled_or_not_a_token_task(run)]
    scores = per_seed_scores(runs, "auc" if metric == "auc" else "final")
    families = task_families(runs)
    tasks = sorted(task for task, algo in scores if algo == candidate and in_group(families[task], group)
                   and (task, "ppo") in scores
                   and min(len(scores[(task, candidate)]), len(scores[(task, "ppo")])) >= MIN_SEEDS)
    if not tasks:
        return None
    seeds = min(min(len(scores[(t, candidate)]), len(scores[(t, "ppo")])) for t in tasks)
    ours = np.stack([scores[(t, candidate)][:seeds] for t in tasks], axis=1)
    ppo = np.stack([scores[(t, "ppo")][:seeds] for t in tasks], axis=1)
    steps = sorted({run["env_steps"] for run in runs if run["env"] in tasks})
    tuning = {algo: tuning_of([r for r in runs if r["algo"] == algo and r["env"] in tasks])
              for algo in (candidate, "ppo")}
    tuned_on = set().union(*(t["tasks"] for t in tuning.values() if t))
    row = {"tasks": ", ".join(f"{t}*" if t in tuned_on else t for t in tasks), "seeds": seeds,
           "env_steps": "/".join(f"{s // 1000}k" for s in steps),
           "tuning": "; ".join(f"{algo}: {t['text'] if t else 'untuned'}" for algo, t in tuning.items())}
    if metric == "std":
        ratios = ours.std(axis=0) / ppo.std(axis=0)
        row.update(value=float(np.exp(np.mean(np.log(ratios)))), ci_low=np.nan, ci_high=np.nan,
                   per_task=", ".join(f"{r:.2f}" for r in ratios))
    else:
        point, low, high = probability_of_improvement(ours, ppo)
        row.update(value=point, ci_low=low, ci_high=high, per_task="")
    return row


def tuning_of(runs: list[dict]) -> dict | None:
    """How these runs' preset was tuned: the study whose best values every run used, or None (untuned)."""
    found = {study_provenance(run["config"]) for run in runs}
    if not found or None in found:
        return None
    if len(found) == 1:
        text, tasks = found.pop()
        return {"text": text, "tasks": set(tasks)}
    # tasks of two families (e.g. MuJoCo and Pendulum), each run on its own family's study
    return {"text": " + ".join(f"{text} ({'+'.join(tasks)})" for text, tasks in sorted(found)),
            "tasks": set().union(*(tasks for _, tasks in found))}


def verdict(row: dict, metric: str) -> str:
    if metric == "std":
        return ("lower" if row["value"] < 1 else "not lower") + " (point estimate, no CI)"
    if row["ci_low"] > 0.5:
        return "better (CI above 0.5)"
    if row["ci_high"] < 0.5:
        return "worse (CI below 0.5)"
    return "no difference established (CI spans 0.5)"


def claims_table(runs: list[dict]) -> pd.DataFrame:
    rows = []
    for paper, claim, preset, group, metric in CLAIMS:
        row = measure(runs, preset, group, metric)
        if row is None:
            continue
        rows.append({"paper": paper, "claim": claim, "preset": preset, "group": group, "metric": metric, **row,
                     "verdict": verdict(row, metric)})
    return pd.DataFrame(rows)


def claims_markdown(table: pd.DataFrame, suites: list[Path]) -> str:
    def measured(row) -> str:
        if row["metric"] == "std":
            return f"{row['value']:.2f} (per task {row['per_task']})"
        return f"{row['value']:.2f} [{row['ci_low']:.2f}, {row['ci_high']:.2f}]"

    shown = pd.DataFrame({
        "paper": table["paper"], "claim": table["claim"], "preset": table["preset"],
        "tasks (seeds, budget; * = tuning task)": [f"{t} ({s} seeds, {b})" for t, s, b in
                                                   zip(table["tasks"], table["seeds"], table["env_steps"])],
        "tuning (candidate; PPO)": table["tuning"],
        "measured": [f"{METRIC_TEXT[m].split(' (')[0]}: {measured(r)}" for m, (_, r) in
                     zip(table["metric"], table.iterrows())],
        "verdict": table["verdict"],
    })
    sources = ", ".join(f"results/runs/{p.name} (`python run.py -m +experiment={p.name}`)" for p in suites)
    return (
        "# Paper claims vs this suite\n\n"
        f"Runs: {sources}; table by `python -m benchmarks.claims {' '.join(f'results/runs/{p.name}' for p in suites)}`. "
        "Tuning: trials per preset x tuning tasks x seeds x env steps per trial, from the preset's study "
        "(results/tuning/<family>.db, docs/tuning.md); PPO and each variant got the same number of trials. "
        "Probability of improvement (rliable, stratified bootstrap, 95% CI) compares "
        "each seed's score with each PPO seed's on the same task and averages over tasks; a CI containing 0.5 "
        "means no difference is established at these seed counts.\n\n" + shown.to_markdown(index=False) + "\n"
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suites", nargs="*", type=existing_directory,
                        default=[RESULTS / "runs" / name for name in TUNED_SUITES if (RESULTS / "runs" / name).is_dir()])
    parser.add_argument("--out", type=Path, default=RESULTS / "tables")
    parser.add_argument("--name", default="claims", help="file name of the table (claims -> claims.md, claims.csv)")
    args = parser.parse_args(argv)
    runs = [run for suite in args.suites for run in load_runs(suite)]
    if greedy := sum(not sampled_or_not_a_token_task(run) for run in runs):
        print(f"left out: {greedy} token-task runs evaluated greedily (made before the sampled evaluation, "
              f"docs/rlhf.md); rerun them to compare presets on token tasks", file=sys.stderr)
    table = claims_table(runs)
    if table.empty:  # nothing to say: the committed table stays as it is
        parser.exit(2, f"{parser.prog}: error: no claim can be checked from {', '.join(map(str, args.suites))} "
                       f"(no complete runs of a preset and of ppo on a common task)\n")
    args.out.mkdir(parents=True, exist_ok=True)
    table.round(6).to_csv(args.out / f"{args.name}.csv", index=False)
    text = claims_markdown(table, args.suites)
    (args.out / f"{args.name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
