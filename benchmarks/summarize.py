"""Per (env, algo) summary of stored runs: final evaluation and CleanRL's training-episode metric.

    python -m benchmarks.summarize results/runs/ppo_mujoco_1M
    python -m benchmarks.summarize results/runs/ppo_cartpole_100k --curve
    python -m benchmarks.summarize results/runs/rlhf_kl/RLHFPraise/ppo/kl_coef=0.0 \
        --train-columns episode_return_mean episode_judge kl_to_reference --last-iterations 10

A terminal quick look; `python -m benchmarks.report` writes the tables and plots.

A run is a directory with summary.json (status complete), train.csv, eval.csv
and episodes.csv. Columns:
- final_eval: deterministic-policy evaluation at the end of training, mean +- std over seeds;
- last100_train: CleanRL's metric - per seed, the mean return of the last 100
  training episodes (stochastic policy), then mean +- std over seeds (or how many
  seeds finished no episode);
- sps: env steps per wall-clock second of the whole run (evaluation included);
- cpu_hours: what the runs cost on one core per process: each run's training-loop time over all its
  segments, a population's shared among the seeds trained together (a total follows the table).
Runs that are not complete (training now, interrupted, failed) are left out of the table and named below it.
A preset whose runs hold several configurations (a sweep over algo.lr in one folder) gets a row per
configuration, named by its values of the keys they differ in: `ppo (algo.lr=0.001)`.
"""

from __future__ import annotations

import argparse
import difflib
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.engine.logger import read_csv_complete_rows
from benchmarks.arguments import number_in, run_printing_command, suite_directory
from benchmarks.runs import (eval_curves, group_runs, last_episodes_mean, left_out_lines, load_runs,
                             mixed_configurations, one_preset_per_configuration)
from benchmarks.tuning import training_seconds


def mean_std(values) -> str:
    values = np.asarray(values, dtype=float)
    return f"{values.mean():.2f} +- {values.std():.2f}"


def last_episodes_column(values: list[float]) -> str:
    """last100_train's cell: mean +- std over seeds; where seeds finished no training episode (a budget shorter than
    the task's episodes: the metric does not exist), over the others, with how many those seeds are."""
    values = np.asarray(values, dtype=float)
    without = int(np.isnan(values).sum())
    if not without:
        return mean_std(values)
    if without == len(values):
        return f"no episode ended ({without} of {without} seeds)"
    return f"{mean_std(values[~np.isnan(values)])} ({without} of {len(values)} seeds ended no episode)"


def summarize(runs: list[dict]) -> pd.DataFrame:
    rows = []
    for (env, algo), group in group_runs(runs).items():
        final_eval = [run["eval"]["eval_return_mean"].iloc[-1] for run in group]
        last100 = [last_episodes_mean(run) for run in group]
        rows.append({
            "env": env, "algo": algo, "seeds": " ".join(str(r["seed"]) for r in group),
            "env_steps": group[0]["env_steps"],
            "final_eval": mean_std(final_eval),
            "last100_train": last_episodes_column(last100),
            "per_seed_final_eval": " ".join(f"{v:.1f}" for v in final_eval),
            "sps": f"{np.mean([r['sps'] for r in group]):.0f}",
            "cpu_hours": round(sum(training_seconds(r["dir"]) for r in group) / 3600, 2),
        })
    return pd.DataFrame(rows)


def train_column_means(runs: list[dict], columns: list[str], last: int | None = None,
                       first: int | None = None) -> pd.DataFrame:
    """Mean over iterations (the first `first` or the last `last` of each run, or all) and seeds of train.csv columns."""
    rows = []
    for env, algo in sorted({(r["env"], r["algo"]) for r in runs}):
        logs = [read_csv_complete_rows(r["dir"] / "train.csv") for r in runs if (r["env"], r["algo"]) == (env, algo)]
        logs = [log.tail(last) for log in logs] if last else logs
        logs = [log.head(first) for log in logs] if first else logs
        log = pd.concat(logs)
        rows.append({"env": env, "algo": algo, **{c: round(float(log[c].mean()), 4) if c in log else None
                                                   for c in columns}})
    return pd.DataFrame(rows)


def final_eval_columns(runs: list[dict], columns: list[str]) -> pd.DataFrame:
    """The final evaluation row's columns (eval.csv: a token task's reward-model and judge scores, KL, length), mean
    +- std over seeds."""
    rows = []
    for (env, algo), group in group_runs(runs).items():
        finals = [run["eval"].iloc[-1] for run in group]
        rows.append({"env": env, "algo": algo, **{c: mean_std([final[c] for final in finals]) if c in finals[0] else None
                                                   for c in columns}})
    return pd.DataFrame(rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs_dir", type=suite_directory)
    parser.add_argument("--curve", action="store_true", help="also print the mean eval curve per (env, algo)")
    parser.add_argument("--train-columns", nargs="+", default=[], metavar="COLUMN",
                        help="also print the mean over iterations (and seeds) of these train.csv diagnostics")
    parser.add_argument("--eval-columns", nargs="+", default=[], metavar="COLUMN",
                        help="also print these eval.csv columns of the final evaluation, mean +- std over seeds")
    parser.add_argument("--last-iterations", type=number_in(1, integer=True), default=None, metavar="N",
                        help="with --train-columns: the mean over each run's last N iterations only")
    parser.add_argument("--first-iterations", type=number_in(1, integer=True), default=None, metavar="N",
                        help="with --train-columns: the mean over each run's first N iterations only")
    args = parser.parse_args(argv)
    if args.last_iterations and args.first_iterations:
        parser.error("--last-iterations and --first-iterations: one of them")
    skipped: list[tuple[Path, str]] = []
    runs = load_runs(args.runs_dir, skipped)
    left_out = left_out_lines(args.runs_dir, skipped)
    if not runs:
        raise SystemExit("\n".join([f"no complete runs under {args.runs_dir}", *left_out]))
    runs = one_preset_per_configuration(runs)  # a sweep over a value of a preset: a row per point
    if (mixed := mixed_configurations(runs)) is not None:
        raise SystemExit(f"error: {mixed}")
    # a column no run logs is a typo, not a preset without it (None in its rows): said before anything is printed
    train_means = (train_column_means(runs, args.train_columns, args.last_iterations, args.first_iterations)
                   if args.train_columns else None)
    eval_finals = final_eval_columns(runs, args.eval_columns) if args.eval_columns else None
    for option, table, columns in (("--train-columns", train_means, args.train_columns),
                                   ("--eval-columns", eval_finals, args.eval_columns)):
        if unknown := [column for column in columns if table[column].map(lambda value: value is None).all()]:
            logged = sorted(set().union(*(read_csv_complete_rows(run["dir"] / "train.csv").columns
                                          if option == "--train-columns" else run["eval"].columns for run in runs))
                            - {"run"})
            named = [f"{column} (did you mean {near[0]}?)" if (near := difflib.get_close_matches(column, logged, n=1))
                     else column for column in unknown]
            parser.error(f"{option}: no run under {args.runs_dir} logs {', '.join(named)}; its runs log "
                         f"{', '.join(logged)}")
    print(summarize(runs).to_string(index=False))
    if left_out:
        print("\n" + "\n".join(left_out))
    hours = sum(training_seconds(run["dir"]) for run in runs) / 3600  # not the sum of the rounded rows
    print(f"\nCPU-hours in all: {hours:.2f} ({len(runs)} runs; each process's training-loop time, a population's "
          f"shared among its seeds)")
    if args.train_columns:
        which = (f"the last {args.last_iterations} iterations" if args.last_iterations else
                 f"the first {args.first_iterations} iterations" if args.first_iterations else "all iterations")
        print(f"\nmean over {which} and seeds of train.csv columns")
        print(train_means.to_string(index=False))
    if args.eval_columns:
        print("\nfinal evaluation's eval.csv columns, mean +- std over seeds")
        print(eval_finals.to_string(index=False))
    if args.curve:
        for env, algo in sorted({(r["env"], r["algo"]) for r in runs}):
            group = [r for r in runs if r["env"] == env and r["algo"] == algo]
            curves = eval_curves(group)
            print(f"\n{env} / {algo}: eval return vs env steps (mean, std over {len(group)} seeds)")
            print(pd.DataFrame({"mean": curves.mean(axis=1).round(1), "std": curves.std(axis=1, ddof=0).round(1)})
                  .T.to_string())


if __name__ == "__main__":
    run_printing_command(main)
