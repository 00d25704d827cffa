"""Learning-regression check: candidate evaluation curves against committed reference curves.

    python -m benchmarks.regression --reference results/reference/ci --candidate RUNS_DIR

For every (env, algo) of the reference, two metrics per seed from eval.csv:
- auc:   area under the eval-return curve divided by its span in env steps
         (the mean return over training: speed of learning);
- final: the last evaluation's return.
Verdict per metric, with d = mean(candidate) - mean(reference) over seeds:
- REGRESSION when both hold:
    significant: the one-sided (1 - alpha) bootstrap upper bound of d is < 0
                 (seeds resampled with replacement in each group, fixed RNG);
    large:       d < -min_effect * progress, where progress is how far the
                 reference learned: mean(reference final) - mean(reference first eval).
- MISSING when the candidate has no complete run for a reference (env, algo), or fewer
  complete runs of it than the reference has (a seed that failed or did not finish).
- INCOMPARABLE when the candidate's runs were evaluated at other env steps than
  the reference's (another total_steps, eval.every_steps, eval.at_start or
  rollout size, since evaluations fall on iteration boundaries): their AUC and
  final return measure another horizon; or when the reference's own runs of the
  cell were. A line below the table says which.
- ok otherwise.
Exit status 1 on any REGRESSION, MISSING or INCOMPARABLE, else 0 (141 where the reader of its output stops
early, as `| head` does). On CPU with the same code
and seeds the runs are bit-identical and d is exactly 0; the two guards are
for machines whose floating point differs, where the curves diverge as
another set of seeds would.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.statistics import area_under_curve
from benchmarks.arguments import number_in, run_printing_command
from benchmarks.runs import group_runs, load_runs, mixed_configurations

METRICS = ("auc", "final")


def curve_metrics(eval_table: pd.DataFrame) -> dict[str, float]:
    curve = eval_table.set_index("env_steps")["eval_return_mean"].astype(float)
    return {"auc": area_under_curve(curve), "final": float(curve.iloc[-1]), "first": float(curve.iloc[0])}


def bootstrap_upper_bound(reference: np.ndarray, candidate: np.ndarray, alpha: float, resamples: int,
                          seed: int = 0) -> float:
    """One-sided (1 - alpha) upper bound of mean(candidate) - mean(reference), seeds resampled per group."""
    rng = np.random.default_rng(seed)
    ref = rng.choice(reference, size=(resamples, len(reference)), replace=True).mean(axis=1)
    cand = rng.choice(candidate, size=(resamples, len(candidate)), replace=True).mean(axis=1)
    return float(np.quantile(cand - ref, 1.0 - alpha))


def eval_schedule(run: dict) -> tuple[int, ...]:
    """The env steps a run was evaluated at."""
    return tuple(int(step) for step in run["eval"]["env_steps"])


def schedule_difference(got: tuple[int, ...], expected: tuple[int, ...]) -> str:
    """Where two evaluation schedules part, in words: each one's count and span, and the first step they differ at."""
    def text(steps):
        return f"{len(steps)} evaluations, at {steps[0]:,} to {steps[-1]:,} env steps"

    first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    at = (f"evaluation {first + 1} at {got[first]:,} against {expected[first]:,}"
          if first < min(len(got), len(expected)) else f"the same first {first} evaluations")
    return f"{text(got)}, the reference {text(expected)} ({at})"


def compare(reference_runs: list[dict], candidate_runs: list[dict], alpha: float, min_effect: float,
            resamples: int) -> pd.DataFrame:
    """One row per (env, algo, metric) of the reference; table.attrs["notes"]: a line per INCOMPARABLE cell and per
    cell MISSING some of the reference's runs."""
    reference, candidate = group_runs(reference_runs), group_runs(candidate_runs)
    rows, notes = [], []
    for key in sorted(reference):
        env, algo = key
        ref = pd.DataFrame([curve_metrics(run["eval"]) for run in reference[key]])
        progress = ref["final"].mean() - ref["first"].mean()
        threshold = -min_effect * abs(progress)
        no_metrics = {"env": env, "algo": algo, "metric": "-", "reference": "-", "candidate": "-", "difference": "-",
                      "upper_bound": "-", "threshold": "-"}
        if key not in candidate:
            rows.append({**no_metrics, "verdict": "MISSING"})
            continue
        if len(candidate[key]) < len(reference[key]):  # a seed that failed (non-finite numbers) or did not finish
            rows.append({**no_metrics, "verdict": "MISSING"})
            absent = sorted({run["seed"] for run in reference[key]} - {run["seed"] for run in candidate[key]})
            notes.append(f"MISSING {env} {algo}: the candidate has {len(candidate[key])} complete runs, the reference "
                         f"{len(reference[key])}" + (f" (no complete run of seed(s) {', '.join(map(str, absent))})"
                                                     if absent else "")
                         + ": a seed that failed or did not finish is not compared as if it had not been asked")
            continue
        expected = eval_schedule(reference[key][0])
        reference_other = [s for s in map(eval_schedule, reference[key]) if s != expected]
        candidate_other = [s for s in map(eval_schedule, candidate[key]) if s != expected]
        if reference_other or candidate_other:
            rows.append({**no_metrics, "verdict": "INCOMPARABLE"})
            if reference_other:
                notes.append(f"INCOMPARABLE {env} {algo}: the reference's own runs were evaluated at different env "
                             f"steps ({len(expected)} and {len(reference_other[0])} evaluations): remake it")
            else:
                notes.append(f"INCOMPARABLE {env} {algo}: the candidate has "
                             f"{schedule_difference(candidate_other[0], expected)}: train it with the reference's "
                             f"total_steps, rollout size (env.num_envs x env.num_steps) and eval settings")
            continue
        cand = pd.DataFrame([curve_metrics(run["eval"]) for run in candidate[key]])
        for metric in METRICS:
            ref_values, cand_values = ref[metric].to_numpy(), cand[metric].to_numpy()
            difference = cand_values.mean() - ref_values.mean()
            upper = bootstrap_upper_bound(ref_values, cand_values, alpha, resamples)
            regression = upper < 0 and difference < threshold
            rows.append({
                "env": env, "algo": algo, "metric": metric,
                "reference": f"{ref_values.mean():.1f} +- {ref_values.std():.1f} (n={len(ref_values)})",
                "candidate": f"{cand_values.mean():.1f} +- {cand_values.std():.1f} (n={len(cand_values)})",
                "difference": f"{difference:.1f}",
                "upper_bound": f"{upper:.1f}",
                "threshold": f"{threshold:.1f}",
                "verdict": "REGRESSION" if regression else "ok",
            })
    table = pd.DataFrame(rows)
    table.attrs["notes"] = notes
    return table


def directory_problem(path: Path) -> str | None:
    """What makes `path` unusable as a directory of runs, or None."""
    if not path.exists():
        return "does not exist"
    if not path.is_dir():
        return "is not a directory"
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", type=Path, required=True, help="directory of reference runs")
    parser.add_argument("--candidate", type=Path, required=True, help="directory of candidate runs")
    parser.add_argument("--alpha", type=number_in(0, 0.5, closed_low=False), default=0.05, help="one-sided significance level")
    parser.add_argument("--min-effect", type=number_in(0), default=0.2,
                        help="smallest drop that counts, as a fraction of the reference's learning progress")
    parser.add_argument("--resamples", type=number_in(1, integer=True), default=10_000)
    parser.add_argument("--tasks", nargs="+", help="only these tasks, as the runs name them (env.name), e.g. CartPole")
    parser.add_argument("--algos", nargs="+", help="only these presets, as the runs name them (algo.name: a variant "
                        "of one's own included), e.g. ppo hp3o")
    args = parser.parse_args(argv)
    for role, path in (("reference", args.reference), ("candidate", args.candidate)):
        problem = directory_problem(path)
        if problem:
            print(f"error: --{role} {path}: {problem}", file=sys.stderr)
            return 2

    def selected(runs: list[dict]) -> list[dict]:
        return [run for run in runs if (not args.tasks or run["env"] in args.tasks)
                and (not args.algos or run["algo"] in args.algos)]

    every_reference_run = load_runs(args.reference)
    for flag, key, names in (("--tasks", "env", args.tasks), ("--algos", "algo", args.algos)):
        held = sorted({run[key] for run in every_reference_run})
        if held and (unknown := [name for name in names or [] if name not in held]):
            parser.error(f"argument {flag}: {', '.join(unknown)}: not in --reference {args.reference} (it holds "
                         f"{', '.join(held)})")
    reference_runs = selected(every_reference_run)
    if not reference_runs:
        print(f"error: --reference {args.reference}: no complete reference runs"
              f"{' for the selected tasks/algos' if args.tasks or args.algos else ''}", file=sys.stderr)
        return 2
    candidate_skipped: list = []
    candidate_runs = selected(load_runs(args.candidate, candidate_skipped))
    if not candidate_runs and not candidate_skipped:
        print(f"error: --candidate {args.candidate}: holds no runs (no summary.json or train.csv under it)",
              file=sys.stderr)
        return 2
    for role, path, runs in (("reference", args.reference, reference_runs),
                             ("candidate", args.candidate, candidate_runs)):
        if (mixed := mixed_configurations(runs)) is not None:
            print(f"error: --{role} {path}: {mixed}", file=sys.stderr)
            return 2
    for run_dir, reason in candidate_skipped:
        print(f"candidate run not used: {run_dir}: {reason}")
    table = compare(reference_runs, candidate_runs, args.alpha, args.min_effect, args.resamples)
    print(table.to_string(index=False))
    for note in table.attrs["notes"]:
        print(note)
    failed = table[table["verdict"] != "ok"]
    print(f"\nalpha {args.alpha} (one-sided bootstrap, {args.resamples} resamples), min effect {args.min_effect} "
          f"x reference progress: {len(failed)} failing of {len(table)} rows")
    return 1 if len(failed) else 0


if __name__ == "__main__":
    run_printing_command(main)
