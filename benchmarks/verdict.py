"""Does my variant beat PPO? The whole protocol for one preset, in one command, resumable.

    python -m benchmarks.verdict --algo ppo_kl --tune mujoco_1m --suite mujoco_1m -- hydra/launcher=joblib hydra.launcher.n_jobs=2
    python -m benchmarks.verdict --algo ppo_kl --tune classic_pruned --suite classic_10seeds -- hydra/launcher=submitit_slurm ...

1. its study, at the family's tuning budget (conf/tune/<tune>.yaml: the same tasks, seeds, trials or env-step
   budget and pruner every preset's study has), on top of the family's tuned PPO core; `--tune none` makes no
   study (a family no round tunes, such as the token tasks): the preset runs on its own values, and the verdict
   says it is untuned;
2. its final evaluation on the suite's fresh seeds and tasks (conf/experiment/<suite>.yaml), with the study's
   best values given as overrides (conf/ is not edited; `python -m benchmarks.tuning apply` makes them the
   family's default), and PPO's runs of the same suite (complete ones, committed or not, are skipped);
3. the comparison: for each task group of the suite, P(preset > PPO) on the final return and on the area under
   the evaluation curve with 95% stratified-bootstrap intervals, and the seed-std ratio (benchmarks.claims'
   measures), printed and written with the preset-vs-PPO figures under results/verdicts/<algo>_<suite>/, the
   candidate's runs in its runs/ (the suite's own directory keeps only what its experiment command makes).

Every step is the suite's own command, run as a subprocess; each skips what is complete and resumes the rest,
so rerunning this command after a kill goes on where it stopped. Arguments after `--` go to every run.py call
(a launcher, or overrides that shrink the protocol for a quick look). The steps run in the project root, from
whatever directory this command is given: a relative path in those overrides (a study's storage, a sweep
directory) is the project's, as `run.py` there reads it; `--out` is read from the current directory.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from benchmarks.arguments import conf_name
from benchmarks.claims import GROUP_FAMILIES, METRIC_TEXT, measure, task_families, verdict
from benchmarks.engine.config import compose_config
from benchmarks.runs import load_runs, mixed_configurations
from benchmarks.tuning import (PROJECT_ROOT, has_complete_trial, load_study, override_value, space_searched,
                               tune_config)

METRICS = ("final", "auc", "std")
STOP_WAIT_S = 120  # after Ctrl-C, how long a step's runs get to finish their iteration and checkpoint


def run(command: list[str]) -> None:
    print("+ " + " ".join(command), flush=True)
    step = subprocess.Popen(command, cwd=PROJECT_ROOT)
    try:
        returncode = step.wait()
    except KeyboardInterrupt:  # the step's runs stop after their iteration, checkpointed (run.py's Ctrl-C)
        step.send_signal(signal.SIGINT)  # a terminal's Ctrl-C reached them already; `kill -INT` this process did not
        try:
            step.wait(timeout=STOP_WAIT_S)
        except (KeyboardInterrupt, subprocess.TimeoutExpired):  # a second Ctrl-C, or a step that does not stop
            step.kill()
            step.wait()
        print(f"interrupted: {' '.join(command)}; rerun this command to resume (a joblib sweep's workers finish "
              f"their iteration after it ends)", file=sys.stderr)
        sys.exit(130)
    if returncode != 0:
        raise SystemExit(f"error: step failed (exit {returncode}): {' '.join(command)}; its output above says why: "
                         f"a refused config needs other arguments, anything else resumes where it stopped when this "
                         f"command is rerun")


def best_overrides(tune: str, algo: str, study_args: list[str]) -> list[str]:
    """The study's best trial's values, as run.py overrides (the storage given in study_args, else the round's)."""
    storage = given(study_args, "hydra.sweeper.storage") or tune_config(tune)["hydra"]["sweeper"]["storage"]
    if storage.startswith("sqlite:///"):  # a relative file is the study step's, which ran in the project root
        storage = f"sqlite:///{PROJECT_ROOT / storage.removeprefix('sqlite:///')}"
    study = load_study(storage, algo)
    if not has_complete_trial(study):
        raise SystemExit(f"error: study {algo} of --tune {tune} has no complete trial: rerun to go on with it")
    return [f"{key}={override_value(value)}" for key, value in study.best_trial.params.items()]


def given(arguments: list[str], key: str) -> str | None:
    values = [a.split("=", 1)[1] for a in arguments if a.split("=", 1)[0].lstrip("+") == key]
    return values[-1] if values else None


def suite_dir(suite: str, suite_args: list[str]) -> Path:
    """Where the suite's runs go: its experiment's hydra.sweep.dir, or the one given."""
    if given(suite_args, "hydra.sweep.dir"):
        return PROJECT_ROOT / given(suite_args, "hydra.sweep.dir")  # as the step, run in the project root, reads it
    return PROJECT_ROOT / compose_config([f"+experiment={suite}"], hydra_settings=True).hydra.sweep.dir


def suite_tasks(suite: str, suite_args: list[str]) -> list[str]:
    """The tasks the final evaluation runs: env= of the suite args, else the experiment's env sweep or env."""
    config = compose_config([f"+experiment={suite}"], hydra_settings=True)
    tasks = given(suite_args, "env") or OmegaConf.select(config, "hydra.sweeper.params.env") or config.env.name
    return str(tasks).split(",")


def families(tasks: list[str]) -> set[str]:
    return {compose_config([f"env={task}"]).env.family for task in tasks}


def tuning_round(text: str) -> str:
    """argparse type of --tune: a conf/tune/<name>.yaml, or none (no study)."""
    if text == "none":
        return text
    try:
        return conf_name("tune")(text)
    except argparse.ArgumentTypeError as error:
        raise argparse.ArgumentTypeError(f"{error}, or none (no study)") from None


def same_family_or_error(tune: str, suite: str, suite_args: list[str]) -> str | None:
    """A study's values are for the family it was tuned on: None when the suite evaluates tasks of that family,
    else the one line that says why not."""
    tuned_on, evaluated = tune_config(tune)["hydra"]["sweeper"]["tasks"], suite_tasks(suite, suite_args)
    tuned_families, evaluated_families = families(tuned_on), families(evaluated)
    if tuned_families & evaluated_families:
        return None
    return (f"--tune {tune} tunes on {', '.join(tuned_on)} ({', '.join(sorted(tuned_families))}) but --suite {suite} "
            f"evaluates {', '.join(evaluated)} ({', '.join(sorted(evaluated_families))}): pick the tuning round "
            f"of the suite's family, or --tune none (no study: the preset's own values)")


def search_space_or_error(tune: str, algo: str, study_args: list[str]) -> str | None:
    """The study searches the preset's space of the round, or one given in --study-args: None when there is one
    (or the study's command cannot be composed: its own step says why), else the one line that says how to give
    one - said before anything trains, not when the study starts."""
    try:
        config = compose_config(["hydra/sweeper=tune", f"+tune={tune}", f"algo={algo}", *study_args],
                                hydra_settings=True)
        spaces, algo = config.hydra.sweeper.search_spaces, config.algo.name
    except Exception:
        return None
    if space_searched(spaces, algo, config.hydra.sweeper.study_name) is not None:  # as the sweeper chooses it
        return None
    return (f"--tune {tune} has no search space for {algo} (it has {', '.join(sorted(spaces))}): add "
            f"one to conf/tune/{tune}.yaml's hydra.sweeper.search_spaces, or give it in --study-args, e.g. "
            f"--study-args \"'+hydra.sweeper.search_spaces.{algo}={{algo.ent_coef:{{low:0.0,high:0.02}}}}'\" "
            f"({{}}: nothing searched, its study trains the values so far once)")


def comparison(runs: list[dict], algo: str) -> pd.DataFrame:
    families = set(task_families(runs).values())
    rows = []
    for group, members in GROUP_FAMILIES.items():
        if not families & members:
            continue
        for metric in METRICS:
            row = measure(runs, algo, group, metric)
            if row is not None:
                rows.append({"group": group, "metric": METRIC_TEXT[metric], **{k: row[k] for k in
                             ("tasks", "seeds", "env_steps", "value", "ci_low", "ci_high", "per_task")},
                             "verdict": verdict(row, metric), "tuning": row["tuning"]})
    return pd.DataFrame(rows)


def markdown_table(table: pd.DataFrame) -> str:
    """The verdict's table, its numbers to three decimals; the per-task ratios as written (two decimals each), also
    where one task leaves a single one that markdown's number parsing would print as 3.300."""
    as_written = [list(table.columns).index("per_task")] if "per_task" in table.columns else False
    return table.to_markdown(index=False, floatfmt=".3f", disable_numparse=as_written)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    common = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", required=True, type=conf_name("algo"), help="the preset (conf/algo/<algo>.yaml)")
    parser.add_argument("--tune", required=True, type=tuning_round,
                        help="the family's tuning round (conf/tune/<tune>.yaml), or none: no study")
    parser.add_argument("--suite", required=True, type=conf_name("experiment"),
                        help="the final evaluation (conf/experiment/<suite>.yaml)")
    parser.add_argument("--study-args", default="", help="overrides for the study's run.py call only (quoted)")
    parser.add_argument("--suite-args", default="", help="overrides for the final evaluation's calls only (quoted)")
    parser.add_argument("--out", type=Path, help="where the verdict goes (default results/verdicts/<algo>_<suite> "
                                                  "of the project)")
    args = parser.parse_args(argv)
    if args.algo == "ppo":  # the baseline: its study and runs are the ones every verdict compares against
        parser.error("--algo ppo is the baseline: PPO's study and its final runs in the suite are what every verdict "
                     "compares against; give a variant")
    study_args, suite_args = [*shlex.split(args.study_args), *common], [*shlex.split(args.suite_args), *common]
    if args.tune != "none":
        for problem in (same_family_or_error(args.tune, args.suite, suite_args),
                        search_space_or_error(args.tune, args.algo, study_args)):
            if problem:
                parser.error(problem)
    # The candidate's runs go to the verdict's own directory (a suite's directory holds what its experiment command
    # makes); PPO's are the suite's own (complete ones, committed or not, are skipped). Checked before the hours of
    # the study: a directory that cannot be made would only fail at the end.
    out = (args.out or PROJECT_ROOT / "results" / "verdicts" / f"{args.algo}_{args.suite}").absolute()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        parser.error(f"argument --out: {out} cannot be made: {error.strerror}")
    if not os.access(out, os.W_OK | os.X_OK):
        parser.error(f"argument --out: {out} is not writable")
    python = [sys.executable, str(PROJECT_ROOT / "run.py")]

    if args.tune == "none":
        print(f"== 1/3: no study (--tune none): {args.algo} runs on its own values", flush=True)
        values = []
    else:
        print(f"== 1/3: the study of {args.algo} (conf/tune/{args.tune}.yaml)", flush=True)
        run([*python, "-m", "hydra/sweeper=tune", f"+tune={args.tune}", f"algo={args.algo}", *study_args])
        values = best_overrides(args.tune, args.algo, study_args)
        print(f"best values: {' '.join(values) or '(none searched)'}", flush=True)

    root = suite_dir(args.suite, suite_args)
    print(f"== 2/3: the final evaluation (conf/experiment/{args.suite}.yaml): {args.algo} into {out / 'runs'}, "
          f"ppo into {root}", flush=True)
    run([*python, "-m", f"+experiment={args.suite}", f"algo={args.algo}", *values, *suite_args,
         f"hydra.sweep.dir={out / 'runs'}"])
    run([*python, "-m", f"+experiment={args.suite}", "algo=ppo", *suite_args])

    print(f"== 3/3: {args.algo} against ppo", flush=True)
    runs = [r for r in load_runs(out / "runs") if r["algo"] == args.algo]
    runs += [r for r in load_runs(root) if r["algo"] == "ppo"]
    if (mixed := mixed_configurations(runs)) is not None:  # e.g. a suite's folder that other sweeps wrote into too
        raise SystemExit(f"error: {mixed}")
    table = comparison(runs, args.algo)
    if table.empty:
        raise SystemExit(f"error: no task has enough complete seeds of both {args.algo} ({out / 'runs'}) and ppo "
                         f"({root})")
    from benchmarks.report import plot_versus_ppo

    figures = plot_versus_ppo(runs, f"{args.algo}_{args.suite}", out)
    command = shlex.join(["python", "-m", "benchmarks.verdict", *argv, *(["--", *common] if common else [])])
    evaluated = (f"no study (`--tune none`), the final evaluation of conf/experiment/{args.suite}.yaml on the "
                 f"preset's own values" if args.tune == "none" else
                 f"the study of conf/tune/{args.tune}.yaml, the final evaluation of conf/experiment/{args.suite}.yaml "
                 f"with the study's best values {' '.join(f'`{v}`' for v in values) or '(none)'}")
    # a preset's own values may be a study's best (conf/algo/<name>.yaml): that study, not one this command ran
    tuning_heading = ("Tuning (no study run by this command: the studies whose best values the runs hold)"
                      if args.tune == "none" else "Tuning")
    text = (f"# Does {args.algo} beat PPO?\n\nMade by `{command}`: {evaluated}. P(...) is rliable's probability of "
            f"improvement over tasks with a 95% stratified-bootstrap interval; * marks a tuning task.\n\n"
            + markdown_table(table.drop(columns=["tuning"]))
            + f"\n\n{tuning_heading}: {table['tuning'].iloc[0]}\n\nFigures: {', '.join(p.name for p in figures)}\n")
    (out / "verdict.md").write_text(text)
    table.to_csv(out / "verdict.csv", index=False)
    print(table.drop(columns=["tuning", "per_task"]).to_string(index=False))
    print(f"wrote {out / 'verdict.md'}")


if __name__ == "__main__":
    main()
