"""What the papers claim next to what this suite measured, with a verdict against PPO and one against the paper.

    python -m benchmarks.claims                      # the tuned suites (TUNED_SUITES under results/runs)
    python -m benchmarks.claims NEW_SUITE OLD_SUITE  # each row from the first suite that answers it (never pooled)
    python -m benchmarks.claims SUITE_DIR ... --out results/tables --name claims_untuned

Writes results/tables/claims.md and claims.csv. Scores are raw returns per
task: the probability of improvement compares runs within a task and then
averages over tasks, so no normalisation is needed. The report's aggregate
(benchmarks.report) normalises each task by one rule, which leaves the
probability of improvement as it is: on the same tasks and seeds it gives the
same numbers (tests/test_report.py holds the MuJoCo suite to it). Tasks enter a group only where both PPO and the candidate have at least 3
complete seeds, and each group uses the first k seeds, k the smallest seed
count among its tasks (rliable's stratified bootstrap needs equal runs per task).

A group is one task family (conf/env_family): families are never pooled in one row. Each row states the values
the candidate's runs used (the keys its study tuned, read from the runs' configs), the paper's own setting and the
effect it reports, the smallest effect this design can detect at its seeds and tasks, and two verdicts: against
PPO, and against the paper (PAPER_VERDICTS). The header states each study's tuning budget once
(benchmarks/tuning.py: a run counts as tuned when every value of its family's best trial is the value it ran with);
tasks marked * were tuning tasks (the final evaluation uses other seeds).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.engine.validate import get_dotted
from benchmarks.regression import eval_schedule
from benchmarks.report import RESULTS
from benchmarks.statistics import (area_under_curve, detectable_improvement, detectable_std_ratio,
                                   probability_of_improvement, seed_std_ratio)
from benchmarks.arguments import suite_directory
from benchmarks.runs import eval_curves, group_runs, load_runs, mixed_configurations, unequal_budgets
from benchmarks.tuning import budget_text, used_study

# A claim's task group is one task family (env.family of its runs: conf/env_family/<family>.yaml), so a task added
# under a family lands in its group with no list to update, and no row pools two families (MuJoCo with Pendulum,
# say). classic_continuous is classic control with continuous actions, classic with discrete ones; the token tasks
# (docs/rlhf.md) are a family of their own.
GROUP_FAMILIES = {"mujoco": {"mujoco"}, "classic_continuous": {"classic_continuous"}, "discrete": {"classic"},
                  "rlhf": {"rlhf"}}
GROUP_TEXT = {"mujoco": "MuJoCo", "classic_continuous": "classic control, continuous",
              "discrete": "classic control, discrete", "rlhf": "token tasks"}
# The final evaluations of the tuning (docs/tuning.md), each on its family's tuned values; those present are read,
# in this order of preference: a claim's rows come from the first suite in which its preset has runs on every task
# PPO has there in the claim's family (the 1M, 10-seed protocol first; an earlier protocol's suite answers for a
# preset the newer one has not finished), else from the first suite with any common task. No row mixes suites.
TUNED_SUITES = ("mujoco_1m", "classic_10seeds", "rlhf")
MIN_SEEDS = 3  # a task enters a comparison only with at least this many seeds of both algorithms


@dataclass(frozen=True)
class Claim:
    paper: str
    claim: str  # what the paper claims, in this suite's words
    setting: str  # the paper's own setting
    reported: str  # the effect the paper reports
    expects: str | None  # "gain", "no gain", "lower spread", "context" (not claimed), None (not a paper's claim)
    preset: str
    group: str
    metric: str  # "final", "auc" or "std"


OUTER_PROTOCOL = ("PPO tuned with 600 trials, each variant with 100; optimality gap and P(improvement) over "
                  "normalised returns")
OUTER_GAIN = "Brax (continuous control) and Jumanji; {values}; " + OUTER_PROTOCOL
OUTER_NONE = "MinAtar (discrete actions); {values}; " + OUTER_PROTOCOL
OUTER_TOKENS = "not tested by the paper: its gain on Brax and Jumanji, carried over to this suite's token tasks"
HP3O_SETTING = "continuous-control tasks, against PPO over several seeds"
HP3O_PLUS_SETTING = "as HP3O, with the best trajectory's value as the baseline of other trajectories' states"
USER = ("(named preset)", "inner SGD lr 1, outer AdamW: not a paper claim", "-", "-", None)
CONTINUOUS = ("mujoco", "classic_continuous")  # the families with continuous actions, as the papers' tasks


def outer(variant: str, values: str, preset: str) -> list[Claim]:
    """The paper's gain on continuous control, checked on each continuous family here, and its no-gain with discrete
    actions."""
    return [
        *(Claim("Outer-PPO", f"{variant} beats PPO tuned alike", OUTER_GAIN.format(values=values),
                "significant gain over PPO", "gain", preset, group, "final") for group in CONTINUOUS),
        Claim("Outer-PPO", f"{variant}: no gain with discrete actions", OUTER_NONE.format(values=values),
              "no significant gain", "no gain", preset, "discrete", "final"),
    ]


def hp3o(paper: str, setting: str, preset: str, group: str) -> list[Claim]:
    return [
        Claim(paper, "better sample efficiency than PPO", setting, "higher return earlier in training", "gain",
              preset, group, "auc"),
        Claim(paper, "lower variance across seeds than PPO", setting, "smaller spread of returns across seeds",
              "lower spread", preset, group, "std"),
        Claim(paper, "final return: not claimed (context)", setting, "-", "context", preset, group, "final"),
    ]


CLAIMS = [
    *outer("outer learning rate sigma != 1", "sigma tuned per task, the best differing by task", "outer_ppo_lr"),
    *outer("outer Nesterov momentum mu", "(sigma, mu) tuned per task, the best differing by task",
           "outer_ppo_nesterov"),
    *(Claim("Outer-PPO", "biased inner start: no gain claimed", OUTER_GAIN.format(values="the bias coefficient tuned"),
            "evaluated, but not among the changes with a significant gain", "no gain", "outer_ppo_biased", group,
            "final") for group in CONTINUOUS),
    Claim("Outer-PPO", "biased inner start: no gain with discrete actions", OUTER_NONE.format(values="the bias coefficient tuned"),
          "no significant gain", "no gain", "outer_ppo_biased", "discrete", "final"),
    *(Claim(*USER, "outer_ppo", group, "final") for group in (*CONTINUOUS, "discrete")),
    *(row for group in CONTINUOUS for paper, setting, preset in (
        ("HP3O", HP3O_SETTING, "hp3o"), ("HP3O+", HP3O_PLUS_SETTING, "hp3o_plus"))
      for row in hp3o(paper, setting, preset, group)),
    # Where both papers place their motivation: RLHF, with costly trajectories (docs/rlhf.md)
    Claim("Outer-PPO", "outer learning rate sigma != 1 beats PPO", OUTER_TOKENS, "-", "gain", "outer_ppo_lr", "rlhf",
          "final"),
    Claim("Outer-PPO", "outer Nesterov momentum mu beats PPO", OUTER_TOKENS, "-", "gain", "outer_ppo_nesterov",
          "rlhf", "final"),
    Claim("Outer-PPO", "biased inner start: no gain claimed", OUTER_TOKENS, "-", "no gain", "outer_ppo_biased",
          "rlhf", "final"),
    Claim(*USER, "outer_ppo", "rlhf", "final"),
    Claim("HP3O", "better sample efficiency than PPO", "not tested by the paper (token tasks)", "-", "gain", "hp3o",
          "rlhf", "auc"),
    Claim("HP3O+", "better sample efficiency than PPO", "not tested by the paper (token tasks)", "-", "gain",
          "hp3o_plus", "rlhf", "auc"),
]
METRIC_TEXT = {
    "final": "P(final eval return > PPO's)",
    "auc": "P(area under eval curve > PPO's)",
    "std": "seed std of final return / PPO's (geometric mean over tasks; < 1 = lower variance)",
}
MEASURED_TEXT = {"final": "P(final > PPO)", "auc": "P(AUC > PPO)", "std": "std / PPO's"}
# The verdict against the paper, from the row's 95% interval (the null: 0.5 for P(improvement), 1 for the std ratio)
PAPER_VERDICTS = (
    "where the paper reports a gain, an interval above 0.5 is consistent, one spanning 0.5 not reproduced, one below "
    "0.5 contradicted; where it reports no gain, an interval above 0.5 is contradicted, any other consistent (a loss "
    "is no gain either); where it reports a lower spread across seeds, a std-ratio interval below 1 is consistent, "
    "one spanning 1 not reproduced, one above 1 contradicted; the named preset's rows are not a paper claim and the "
    "final-return rows of HP3O(+) are context, not claimed: those have the verdict against PPO only")


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
    from benchmarks.engine.config import with_later_keys  # imported here: it loads the algorithms (torch)

    return with_later_keys(run["config"])["env"]["evaluation"]["kind"] == "sampled"


def measure(runs: list[dict], candidate: str, group: str, metric: str) -> dict | None:
    runs = [run for run in runs if sampled_or_not_a_token_task(run)]
    scores = per_seed_scores([run for run in runs if run["algo"] in (candidate, "ppo")],
                             "auc" if metric == "auc" else "final")
    families = task_families(runs)

    def compared(task: str) -> list[dict]:
        return [run for run in runs if run["env"] == task and run["algo"] in (candidate, "ppo")]

    tasks = sorted(task for task, algo in scores if algo == candidate and in_group(families[task], group)
                   and (task, "ppo") in scores
                   and min(len(scores[(task, candidate)]), len(scores[(task, "ppo")])) >= MIN_SEEDS
                   # equal budgets only: a task where the two trained different numbers of env steps is no comparison
                   and not unequal_budgets(compared(task))
                   # and for the area under the curve one evaluation schedule: the trapezoids of a coarser one cut
                   # more off a concave curve
                   and (metric != "auc" or len(set(map(eval_schedule, compared(task)))) == 1))
    if not tasks:
        return None
    seeds = min(min(len(scores[(t, candidate)]), len(scores[(t, "ppo")])) for t in tasks)
    if metric == "std":  # a task where neither side's seeds spread (both saturated) has no spread to compare
        tasks = [t for t in tasks if np.ptp(scores[(t, candidate)][:seeds]) > 0 or np.ptp(scores[(t, "ppo")][:seeds]) > 0]
        if not tasks:
            return None
    ours = np.stack([scores[(t, candidate)][:seeds] for t in tasks], axis=1)
    ppo = np.stack([scores[(t, "ppo")][:seeds] for t in tasks], axis=1)
    steps = sorted({run["env_steps"] for run in runs if run["env"] in tasks and run["algo"] in (candidate, "ppo")})
    used = {algo: [r for r in runs if r["algo"] == algo and r["env"] in tasks] for algo in (candidate, "ppo")}
    tuning = {algo: tuning_of(algo_runs) for algo, algo_runs in used.items()}
    tuned_on = set().union(*(t["tasks"] for t in tuning.values() if t))
    row = {"tasks": ", ".join(f"{t}*" if t in tuned_on else t for t in tasks), "seeds": seeds,
           "env_steps": "/".join(f"{s // 1000}k" for s in steps),
           "tuning": "; ".join(f"{algo}: {t['text'] if t else 'untuned'}" for algo, t in tuning.items()),
           "values_tested": values_tested(used[candidate], tuning[candidate]),
           "ppo_values": values_tested(used["ppo"], tuning["ppo"]),
           "study": study_names(tuning[candidate]), "ppo_study": study_names(tuning["ppo"]),
           "studies": {algo: t["studies"] if t else {} for algo, t in tuning.items()}}
    if metric == "std":
        point, low, high, ratios = seed_std_ratio(ours, ppo)
        row.update(value=point, ci_low=low, ci_high=high, per_task=", ".join(f"{r:.2f}" for r in ratios),
                   detectable=detectable_std_ratio(seeds, len(tasks)))
    else:
        point, low, high = probability_of_improvement(ours, ppo)
        row.update(value=point, ci_low=low, ci_high=high, per_task="",
                   detectable=detectable_improvement(seeds, len(tasks)))
    return row


def study_of(config: dict) -> dict | None:
    """The study whose best values a run used (benchmarks.tuning.used_study): its database's name, budget, tuning
    tasks and the keys it tuned; None if untuned."""
    found = used_study(config)
    if found is None:
        return None
    database, study = found
    text, tasks = budget_text(study), tuple(study.user_attrs["base"]["tasks"])
    return {"study": database.stem, "text": text, "tasks": tasks, "keys": tuple(study.best_trial.params),
            "budget": f"{text} ({', '.join(tasks)})"}


def tuning_of(runs: list[dict]) -> dict | None:
    """How these runs' preset was tuned: the study whose best values every run used, or None (untuned)."""
    found = [study_of(run["config"]) for run in runs]
    if not found or None in found:
        return None
    studies = {f["study"]: f for f in found}
    keys = list(dict.fromkeys(key for f in studies.values() for key in f["keys"]))
    if len(studies) == 1:
        (only,) = studies.values()
        return {"text": only["text"], "tasks": set(only["tasks"]), "studies": {only["study"]: only["budget"]},
                "keys": keys}
    # tasks of two families (the verdict command's callers may pass any runs), each run on its own family's study
    return {"text": " + ".join(f"{f['text']} ({'+'.join(f['tasks'])})" for f in sorted(
                studies.values(), key=lambda f: (f["text"], f["tasks"]))),
            "tasks": set().union(*(f["tasks"] for f in studies.values())),
            "studies": {name: f["budget"] for name, f in studies.items()}, "keys": keys}


def study_names(tuning: dict | None) -> str:
    return "+".join(sorted(tuning["studies"])) if tuning else "untuned"


def values_tested(runs: list[dict], tuning: dict | None) -> str:
    """The values the runs used at the keys their preset's study tuned (read from the runs' stored configs); for an
    untuned preset, its own block of the family's values (env.tuned.<preset>), marked untuned."""
    preset = runs[0]["config"]["algo"]["name"]
    if tuning:
        keys = tuning["keys"]
    else:
        block = runs[0]["config"]["env"].get("tuned", {}).get(preset, {})
        keys = [f"env.tuned.{preset}.{key}" for key, value in block.items()
                if not (isinstance(value, str) and len(value) > 20)]  # a note, not a value
    parts = []
    for key in keys:
        values = list(dict.fromkeys(short_value(get_dotted(run["config"], key)) for run in runs))
        short = key.removeprefix(f"env.tuned.{preset}.").removeprefix("env.hparams.").removeprefix("algo.")
        parts.append(f"{short} {'/'.join(values)}")
    return ("" if tuning else "untuned: ") + (", ".join(parts) or "the preset's defaults")


def short_value(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def verdict(row: dict, metric: str) -> str:
    """Against PPO, from the 95% interval: above or below the null (0.5; 1 for the std ratio), or across it."""
    null, above, below = (1, "higher variance", "lower variance") if metric == "std" else (0.5, "better", "worse")
    if row["ci_low"] > null:
        return f"{above} (CI above {null})"
    if row["ci_high"] < null:
        return f"{below} (CI below {null})"
    return f"no difference established (CI spans {null})"


def paper_verdict(expects: str | None, row: dict, metric: str) -> str:
    """Against the paper (PAPER_VERDICTS): consistent, not reproduced or contradicted."""
    if expects is None:
        return "not a paper claim"
    if expects == "context":
        return "not claimed (context)"
    null = 1 if metric == "std" else 0.5
    above, below = row["ci_low"] > null, row["ci_high"] < null
    if expects == "no gain":
        return "contradicted" if above else "consistent"
    claimed, opposite = (below, above) if expects == "lower spread" else (above, below)
    return "consistent" if claimed else "contradicted" if opposite else "not reproduced"


COLUMNS = ["paper", "claim", "paper_setting", "paper_effect", "expects", "preset", "group", "metric", "suite", "tasks",
           "seeds",
           "env_steps", "values_tested", "ppo_values", "study", "ppo_study", "value", "ci_low", "ci_high", "per_task",
           "detectable", "vs_ppo", "vs_paper"]


def group_tasks(runs: list[dict], algo: str, group: str) -> set[str]:
    """The group's tasks on which algo has at least MIN_SEEDS complete runs."""
    runs = [run for run in runs if sampled_or_not_a_token_task(run)]
    families = task_families(runs)
    scores = per_seed_scores([run for run in runs if run["algo"] == algo], "final")
    return {task for (task, _), seeds in scores.items() if in_group(families[task], group) and len(seeds) >= MIN_SEEDS}


def preferred_measure(by_suite: dict[str, list[dict]], preset: str, group: str, metric: str) -> dict | None:
    """measure() on one suite: the first (in the order given) where the preset has runs on every task PPO has there
    in the group, else the first where the two share a task; the row names its suite."""
    first = None
    for suite, runs in by_suite.items():
        row = measure(runs, preset, group, metric)
        if row is None:
            continue
        row["suite"] = suite
        if group_tasks(runs, preset, group) >= group_tasks(runs, "ppo", group):
            return row
        first = first or row
    return first


def claims_table(runs: list[dict] | dict[str, list[dict]], claims: list[Claim] = CLAIMS) -> pd.DataFrame:
    """One row per claim that the runs can answer; runs grouped by suite (name -> runs, in order of preference) are
    never pooled across suites (preferred_measure)."""
    by_suite = runs if isinstance(runs, dict) else {"": runs}
    rows = []
    for claim in claims:
        row = preferred_measure(by_suite, claim.preset, claim.group, claim.metric)
        if row is None:
            continue
        rows.append({"paper": claim.paper, "claim": claim.claim, "paper_setting": claim.setting,
                     "paper_effect": claim.reported, "expects": claim.expects or "", "preset": claim.preset,
                     "group": claim.group, "metric": claim.metric, **row, "vs_ppo": verdict(row, claim.metric),
                     "vs_paper": paper_verdict(claim.expects, row, claim.metric)})
    return pd.DataFrame(rows, columns=[*COLUMNS, "studies"])


def budget_lines(table: pd.DataFrame) -> list[str]:
    """One line per tuning study: its budget and the presets tuned by it, with the families whose rows used it."""
    studies: dict[str, dict] = {}
    for _, row in table.iterrows():
        for algo, found in row["studies"].items():
            for name, text in found.items():
                entry = studies.setdefault(name, {"groups": set(), "texts": {}, "ppo": set()})
                entry["groups"].add(GROUP_TEXT[row["group"]])
                entry["texts"].setdefault(text, set()).add(row["preset"] if algo != "ppo" else "ppo")
                if algo == "ppo" and len(found) == 1:
                    entry["ppo"].add(row["ppo_values"])
    untuned = sorted({algo if algo == "ppo" else row["preset"] for _, row in table.iterrows()
                      for algo, found in row["studies"].items() if not found})
    lines = [f"results/tuning/{name}.db ({'; '.join(sorted(entry['groups']))}): " + "; ".join(
                 f"{text} each for {', '.join(sorted(presets, key=lambda p: (p != 'ppo', p)))}"
                 for text, presets in sorted(entry["texts"].items()))
             + "".join(f"; PPO's core, under every preset: {values}" for values in sorted(entry["ppo"]))
             for name, entry in sorted(studies.items())]
    return lines + ([f"untuned (the family's shipped values): {', '.join(untuned)}"] if untuned else [])


def claims_markdown(table: pd.DataFrame, suites: list[Path]) -> str:
    def measured(row) -> str:
        text = f"{MEASURED_TEXT[row['metric']]} {row['value']:.2f} [{row['ci_low']:.2f}, {row['ci_high']:.2f}]"
        return text + (f" (per task {row['per_task']})" if row["metric"] == "std" else "")

    def detectable(row) -> str:
        if row["metric"] == "std" and math.isnan(row["detectable"]):  # statistics.detectable_std_ratio
            tasks = len(row["tasks"].split(", "))
            return (f"none at {row['seeds']} seeds over {tasks} task{'s' * (tasks != 1)} (a resample without spread "
                    f"leaves the interval unbounded)")
        if row["metric"] == "std":
            return f"<= {row['detectable']:.2f} or >= {1 / row['detectable']:.2f}"
        return f">= {row['detectable']:.2f} or <= {1 - row['detectable']:.2f}"

    shown = pd.DataFrame({
        "paper": table["paper"], "claim": table["claim"], "paper's setting": table["paper_setting"],
        "paper's effect": table["paper_effect"], "preset": table["preset"],
        "family": [GROUP_TEXT[g] for g in table["group"]], "suite": table["suite"],
        "tasks (seeds, env steps)": [f"{t} ({s}, {b})" for t, s, b in
                                     zip(table["tasks"], table["seeds"], table["env_steps"])],
        "values tested": table["values_tested"],
        "measured [95% CI]": [measured(r) for _, r in table.iterrows()],
        "detectable": [detectable(r) for _, r in table.iterrows()],
        "vs PPO": table["vs_ppo"], "vs paper": table["vs_paper"],
    })
    paths = " ".join(f"results/runs/{p.name}" for p in suites)
    sources = ", ".join(f"results/runs/{p.name} (`python run.py -m +experiment={p.name}`)" for p in suites)
    comparisons = len(table)
    return (
        "# Paper claims vs this suite\n\n"
        f"Runs: {sources}; table by `python -m benchmarks.claims {paths}`. "
        "One row per claim and task family (families are never pooled), each from one suite (never pooled either): "
        "the first listed in which the preset has runs on every task PPO has there in that family, else the first "
        "with a task in common; * marks a tuning task (its final runs use other seeds); values tested: the "
        "candidate's values at the keys its study tuned, read from the runs' "
        "configs.\n\n"
        "Tuning budget per preset (trials x tuning tasks x seeds per trial x env steps per trial; PPO's core tuned "
        "first, each variant's own values on top of it; docs/tuning.md):\n\n"
        + "".join(f"- {line}\n" for line in budget_lines(table)) + "\n"
        "- Measured: P(... > PPO) is rliable's probability of improvement (each seed's score against each PPO seed's "
        "on the same task, averaged over tasks) with its 95% stratified-bootstrap interval; std / PPO's is the "
        "candidate's seed std of the final return over PPO's, geometric mean over tasks, with a 95% bootstrap "
        "interval that resamples each side's seeds within each task.\n"
        "- Detectable: the smallest effect whose 95% interval would exclude no difference at the row's seeds n and "
        "tasks T, from the estimate's spread when the presets do not differ: P(improvement) beyond 0.5 +- 1.96 "
        "sqrt((2n+1)/(12 n^2 T)) (Mann-Whitney), std ratio beyond exp(-+1.96/sqrt((n-1)T)); a smaller true effect "
        "is likely to read \"no difference established\".\n"
        f"- Verdict against the paper: {PAPER_VERDICTS}.\n"
        f"- Comparisons: this table makes {comparisons} (one interval per row); read at 95%, about 1 in 20 of them "
        f"(here about {comparisons / 20:.1f}) may exclude no difference by chance alone, with no correction for "
        "multiplicity.\n\n"
        + shown.to_markdown(index=False) + "\n"
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suites", nargs="*", type=suite_directory,
                        default=[RESULTS / "runs" / name for name in TUNED_SUITES if (RESULTS / "runs" / name).is_dir()])
    parser.add_argument("--out", type=Path, default=RESULTS / "tables")
    parser.add_argument("--name", default="claims", help="file name of the table (claims -> claims.md, claims.csv)")
    args = parser.parse_args(argv)
    by_suite = {suite: load_runs(suite) for suite in args.suites}
    for suite, suite_runs in by_suite.items():  # of the runs a claim may read (greedy token-task runs: left out)
        if (mixed := mixed_configurations([run for run in suite_runs if sampled_or_not_a_token_task(run)])) is not None:
            parser.error(f"{suite}: {mixed}")
    runs = [run for suite_runs in by_suite.values() for run in suite_runs]
    if greedy := sum(not sampled_or_not_a_token_task(run) for run in runs):
        print(f"left out: {greedy} token-task runs evaluated greedily (made before the sampled evaluation, "
              f"docs/rlhf.md); rerun them to compare presets on token tasks", file=sys.stderr)
    table = claims_table({suite.name: suite_runs for suite, suite_runs in by_suite.items()})
    if table.empty:  # nothing to say: the committed table stays as it is
        parser.exit(2, f"{parser.prog}: error: no claim can be checked from {', '.join(map(str, args.suites))} "
                       f"(no complete runs of a preset and of ppo on a common task)\n")
    # The header names the suites whose runs the rows compare (a suite with none, such as token-task runs all left
    # out, changes nothing), so that the named command remakes the table.
    suites = [suite for suite in by_suite if suite.name in set(table["suite"])]
    args.out.mkdir(parents=True, exist_ok=True)
    table[COLUMNS].round(6).to_csv(args.out / f"{args.name}.csv", index=False)
    text = claims_markdown(table, suites)
    (args.out / f"{args.name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
