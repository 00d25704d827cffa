"""Tuning with equal budgets: Optuna studies over the presets, their objective, and writing the results back.

Protocol (docs/tuning.md), per task family:
  stage 1  tune PPO's core hyperparameters (env.hparams: every preset reads them);
  apply    write the best values into the study's values file (conf/tuning/<round>.yaml: hparams);
  stage 2  tune each variant's own hyperparameters (env.tuned.<preset>) on top of it;
  apply    write each variant's best values into the same file (tuned.<preset>).
A task family makes a round its default by including the values file (conf/env_family/mujoco.yaml
includes conf/tuning/mujoco_300k.yaml); any run can pick a round with +tuning=<round>.
Every preset gets the same number of trials, on the same tuning tasks and tuning seeds.

    python run.py -m hydra/sweeper=tune +tune=mujoco algo=ppo hydra/launcher=joblib hydra.launcher.n_jobs=2
    python -m benchmarks.tuning apply --tune mujoco --algo ppo
    python -m benchmarks.tuning report --tune mujoco

Objective of a run: the area under its evaluation curve (mean evaluation return over
the run, trapezoidal in env steps), normalised per task with the task's random and
reference scores, so tasks of different reward scales average fairly. A trial's
objective is the mean over its runs (tuning tasks x tuning seeds).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from benchmarks.engine.logger import read_csv_complete_rows
from benchmarks.engine.validate import get_dotted
from benchmarks.arguments import conf_name, suite_directory

PROJECT_ROOT = Path(__file__).resolve().parents[1]


class RunNotComplete(RuntimeError):
    """A run of a trial did not finish (failed: diverged, bad values; or was not run)."""


def normalised_auc(run_dir: Path, paused_at: int | None = None) -> float:
    """Area under the run's evaluation curve, divided by its span, in normalised score units.

    paused_at: the run was paused there (pause_at_steps, a pruner's rung): the area of its curve so far.
    """
    from benchmarks.statistics import area_under_curve

    from benchmarks.runs import read_summary, why_not_complete

    summary = read_summary(run_dir)
    if summary["status"] != "complete" and not (paused_at is not None and summary["status"] == "paused"):
        raise RunNotComplete(f"{run_dir}: {why_not_complete(summary)}")
    env = summary["config"]["env"]
    if env.get("reference_score") is None:
        raise ValueError(f"{env['name']} has no env.reference_score: it cannot be a tuning task "
                         f"(its returns cannot be normalised)")
    curve = read_csv_complete_rows(run_dir / "eval.csv").set_index("env_steps")["eval_return_mean"].astype(float)
    if paused_at is not None:  # the curve a run paused at this rung has: up to the first iteration's end at or past it
        rollout = int(env.get("num_envs", 1)) * int(env.get("num_steps", 1))
        if int(summary.get("env_steps") or 0) < paused_at:
            raise RunNotComplete(f"{run_dir}: trained {int(summary.get('env_steps') or 0):,} env steps, short of this "
                                 f"rung's {paused_at:,}")
        # (a run that trained on - a trial resumed past a rung it was judged at, a run of another study in this
        # sweep directory - is scored as it stood there, not over its whole curve)
        curve = curve[curve.index <= math.ceil(paused_at / rollout) * rollout]
    normalised = (curve - env["random_score"]) / (env["reference_score"] - env["random_score"])
    return area_under_curve(normalised)


def trained_env_steps(run_dir: Path) -> int:
    """Env steps a run has trained so far (its summary's; 0 when it never started): what a trial spent."""
    from benchmarks.runs import read_summary

    return int(read_summary(run_dir).get("env_steps") or 0)


def training_seconds(run_dir: Path) -> float:
    """A run's training-loop wall time so far, over all its segments (its summary's wall_time_s: complete, paused,
    interrupted or failed), shared out among the seeds trained together in its process: summed over a trial's runs,
    what the trial cost on one core per process (0 for a run with no summary)."""
    from benchmarks.runs import read_summary, trained_together

    summary = read_summary(run_dir)
    return float(summary.get("wall_time_s") or 0.0) / len(trained_together(summary))


def rung_steps(pruner: dict | None, total_steps: int) -> list[int]:
    """Where a pruned study judges its trials: min_steps * reduction_factor**k below total_steps, then total_steps.

    The same rungs as Optuna's SuccessiveHalvingPruner(min_resource=min_steps, reduction_factor=...) with env
    steps as its resource; no pruner: one rung, the whole budget.
    """
    if pruner is None:
        return [total_steps]
    if not (int(pruner["min_steps"]) >= 1 and int(pruner["reduction_factor"]) >= 2):  # else rungs never reach the end
        raise SystemExit(f"config error: hydra.sweeper.pruner: min_steps must be >= 1 and reduction_factor >= 2 "
                         f"(successive halving keeps 1 in reduction_factor at each rung), got min_steps="
                         f"{pruner['min_steps']}, reduction_factor={pruner['reduction_factor']}")
    rungs, steps = [], int(pruner["min_steps"])
    while steps < total_steps:
        rungs.append(steps)
        steps *= int(pruner["reduction_factor"])
    return [*rungs, total_steps]


# ---------------------------------------------------------------------------
# Search spaces: {key: {low, high, log} | {low, high, int: true} | {choices: [...]}}
# ---------------------------------------------------------------------------


def distribution(key: str, spec: dict):
    import optuna

    if "choices" in spec:
        choices = spec["choices"]
        if not isinstance(choices, list) or not choices:  # a string would be searched letter by letter
            raise ValueError(f"search space entry {key}: choices must be a non-empty list, got {choices!r}")
        if repeated := [choice for i, choice in enumerate(choices) if choice in choices[:i]]:
            raise ValueError(f"search space entry {key}: choices repeat {', '.join(map(repr, repeated))}")
        for choice in choices:  # each must reach its trials as itself (refused here, before a trial is asked)
            override_value(choice)
        return optuna.distributions.CategoricalDistribution(choices)
    if "low" in spec and "high" in spec:
        if spec.get("int", False) and not all(float(spec[end]).is_integer() for end in ("low", "high")):
            raise ValueError(f"search space entry {key}: int: true takes whole bounds (an integer range would "
                             f"quietly round them), got low={spec['low']}, high={spec['high']}")
        kind, number = ((optuna.distributions.IntDistribution, int) if spec.get("int", False)
                        else (optuna.distributions.FloatDistribution, float))
        return kind(number(spec["low"]), number(spec["high"]), log=spec.get("log", False))
    raise ValueError(f"search space entry {key}: give low/high (float; int: true for integers) or choices, got {spec}")


def space_searched(spaces, preset: str, study_name: str) -> str | None:
    """The name of the search space a study of `preset` under `study_name` searches: a study of its own name (one
    inner-loop form of a preset) may have a space of its own, else the preset's; None where the round has neither."""
    name = study_name if study_name in spaces else preset
    return name if name in spaces else None


def is_preset_value(key: str) -> bool:
    """Whether a key is one of the values the presets read through their interpolations (env.hparams.*, env.tuned.*),
    which a values file holds, rather than a key a run reads itself."""
    return key.split(".")[:2] in (["env", "hparams"], ["env", "tuned"])


def search_space_problems(name: str, search_space: dict, config: DictConfig) -> list[str]:
    """Why a study cannot search this space for this config, one line per entry (`name`: where the space is given,
    hydra.sweeper.search_spaces.<preset>), before a study is stored or a trial trains: an entry that is not one of
    distribution()'s forms, or whose bounds Optuna refuses (low above high; log with low <= 0); a key the run's
    config does not hold (its trials would fail or train as the untuned preset); a value under env.hparams or
    env.tuned that no key of the preset reads: such values reach a run only through the preset's interpolations
    (algo.lr: ${env.hparams.lr}), so a value typed over the key that reads it (algo.lr=0.01 on the command line)
    would leave every trial training the typed value while the study believes it searched. What the config reads is
    checked, not what the algorithm uses: a key it reads and a mode of the algorithm ignores (inner_epochs beside
    inner_loop=ppo) passes."""
    import copy

    from benchmarks.engine.validate import unresolved

    try:
        algo = OmegaConf.to_container(config.algo, resolve=True)
    except Exception as error:  # the trials could not run either: said as a run says it
        return [unresolved(error)]
    problems, probe_value = [], "__search_space_probe__"  # a value no config holds
    for key, spec in search_space.items():
        where = f"{name}.{key}"
        if not isinstance(spec, dict):
            problems.append(f"{where}: give {{low: .., high: ..}} (with log: true or int: true) or {{choices: [..]}}, "
                            f"got {spec!r}")
            continue
        try:
            distribution(key, spec)
        except (ValueError, TypeError) as error:
            problems.append(f"{where}: {str(error).removeprefix(f'search space entry {key}: ')}")
            continue
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(config, parent, default=None, throw_on_resolution_failure=False) if parent else config
        if not isinstance(node, DictConfig) or leaf not in node.keys():
            problems.append(f"{where}: the run's config has no key {key}")
            continue
        if OmegaConf.is_missing(node, leaf):
            problems.append(f"{where}: {key} has no value (???) to start the study from")
            continue
        if not is_preset_value(key):
            continue  # a key the run reads itself (algo.*, env.*)
        probe = copy.deepcopy(config)
        OmegaConf.update(probe, key, probe_value, merge=False)
        try:
            read = OmegaConf.to_container(probe.algo, resolve=True) != algo
        except Exception:  # a resolver that cannot take the probe: it reads the key
            read = True
        if not read:
            problems.append(f"{where}: no key of algo={config.algo.name} reads {key}: a value typed over the key that "
                            f"read it (as algo.lr=... replaces algo.lr's ${{env.hparams.lr}}) would train every trial "
                            f"on the typed value; drop that override, or search the algo key itself")
    return problems


def within(dist, value) -> bool:
    import optuna

    if isinstance(dist, optuna.distributions.CategoricalDistribution):
        return value in dist.choices
    return isinstance(value, (int, float)) and dist.low <= value <= dist.high


def same_typed(read: Any, value: Any) -> bool:
    """read is value, of its type (1 is not True, 0.001 is not '1e-3')."""
    return type(read) is type(value) and read == value


def override_value(value: Any) -> str:
    """A Hydra override value that parses back to the same value and type: numbers and plain strings as they print
    (so the directories of stored trials keep their names), null for None, and a string that Hydra would read as
    something else ('1e-3', 'null', 'true', '[a]') quoted."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    def parses_back(text: str) -> bool:
        try:
            return same_typed(OverridesParser.create().parse_override(f"key={text}").value(), value)
        except Exception:  # Hydra's grammar refuses it
            return False

    text = "null" if value is None else repr(value) if isinstance(value, float) else str(value)
    if not parses_back(text) and isinstance(value, str):
        text = "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if not parses_back(text):
        raise ValueError(f"search space entry: the value {value!r} cannot be given to a run as a Hydra override")
    return text


def never_trained(trial) -> bool:
    """A failed trial whose runs trained no env step."""
    import optuna

    return trial.state == optuna.trial.TrialState.FAIL and int(trial.user_attrs.get("env_steps", 0)) == 0


def has_complete_trial(study) -> bool:
    """Whether a study has a best trial to read (Optuna's best_trial raises without a complete one)."""
    import optuna

    return any(trial.state == optuna.trial.TrialState.COMPLETE for trial in study.trials)


def counted(trial) -> bool:
    """A trial that counts towards n_trials and in reports: finished (complete, pruned, failed) and not
    never_trained."""
    return trial.state.is_finished() and not never_trained(trial)


def trial_dir(trial) -> str:
    return f"trial{trial.number:03d}"


def study_lock(storage: str, study_name: str, sweep_dir: Path):
    """One tuning command per study at a time: a second would take the first's running trials for the stale trials
    of a killed command, train them again and tell them twice (Optuna: 'Cannot tell a COMPLETE trial'), both
    spending the budget. Held beside a SQLite database (<database>.<study_name>.lock), else in the sweep directory
    (flock: one machine's processes); where that directory cannot be written, none is held."""
    from benchmarks.engine.run_dir import held_lock

    if (database := sqlite_file(storage)) is not None:
        path = database.with_name(f"{database.name}.{study_name}.lock")
    else:
        path = sweep_dir / f".study-{study_name}.lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        writable = os.access(path.parent, os.W_OK)
    except OSError:
        writable = False
    if not writable:
        return contextlib.nullcontext()
    return held_lock(path, lambda holder: SystemExit(
        f"config error: study {study_name} in {storage} is being tuned by another process (pid {holder}); wait for "
        f"it to finish, or give this command another hydra.sweeper.study_name or storage"))


class TuningStudy:
    """One preset's Optuna study, asked and told in batches; resumable from its storage."""

    def __init__(self, config: DictConfig, search_space: dict, sweep_dir: Path, storage: str, study_name: str,
                 n_trials: int, trials_per_batch: int, sampler_seed: int, n_startup_trials: int, tasks: list,
                 seeds: list, enqueue_defaults: bool, population: bool = False, pruner: dict | None = None,
                 env_step_budget: int | None = None):
        import optuna

        self.config, self.sweep_dir = config, sweep_dir
        # population: a trial's seeds train as one process per task (seeds=[...]), not one job per seed.
        # pruner: successive halving on the evaluation curve, judged at rung_steps; env_step_budget: the study
        # asks no new trial once its finished trials have trained this many env steps (equal budgets in steps).
        self.population, self.pruner, self.env_step_budget = population, pruner, env_step_budget
        self.rungs = rung_steps(pruner, int(config.total_steps))
        self.space = {key: distribution(key, spec) for key, spec in search_space.items()}
        self.n_trials, self.trials_per_batch = n_trials, trials_per_batch
        self.sampler_seed, self.n_startup_trials = sampler_seed, n_startup_trials
        self.tasks, self.seeds = tasks, seeds
        if (database := sqlite_file(storage)) is not None:
            try:
                database.parent.mkdir(parents=True, exist_ok=True)
                database.touch(exist_ok=True)
            except OSError as error:
                raise SystemExit(f"config error: hydra.sweeper.storage={storage}: cannot write the study database "
                                 f"there ({error.strerror})") from None
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        defaults = {key: OmegaConf.select(config, key) for key in self.space}
        outside = [f"{key}={value}" for key, value in defaults.items() if not within(self.space[key], value)]
        new_study = study_name not in optuna.get_all_study_names(storage=storage)
        if enqueue_defaults and new_study and outside:  # checked before anything is stored: a refused start leaves no study
            raise SystemExit(f"config error: the preset's current values lie outside the search space "
                             f"({', '.join(outside)}): widen it, or set enqueue_defaults=false")
        self.study = optuna.create_study(
            storage=storage, study_name=study_name, direction="maximize", load_if_exists=True,
            pruner=(optuna.pruners.SuccessiveHalvingPruner(min_resource=int(pruner["min_steps"]),
                                                           reduction_factor=int(pruner["reduction_factor"]))
                    if pruner is not None else optuna.pruners.NopPruner()))
        # What the trials are tuned on top of: PPO's core for the family. A rerun with other
        # values would mix two baselines in one study.
        core = {key: value for key, value in OmegaConf.to_container(config.env.hparams, resolve=True).items()
                if f"env.hparams.{key}" not in self.space}  # the values searched are no baseline
        base = {"env.hparams": core,
                "tasks": list(tasks), "seeds": list(seeds), "total_steps": int(config.total_steps),
                "search_space": search_space,
                # keys of the pruned studies only, so that the studies before them keep comparing equal
                **({"pruner": pruner, "env_step_budget": env_step_budget} if pruner is not None else {})}
        stored = self.study.user_attrs.get("base")
        if stored is None:
            self.study.set_user_attr("base", base)
        elif json.dumps(stored, sort_keys=True) != json.dumps(base, sort_keys=True):
            changed = sorted(k for k in base if json.dumps(base[k], sort_keys=True) != json.dumps(stored.get(k),
                                                                                                 sort_keys=True))
            raise SystemExit(f"config error: study {study_name} in {storage} was started with other "
                             f"{', '.join(changed)}: give it another study_name or storage")
        # The first trial is the preset's values before tuning; asked again if its jobs were refused (it trained
        # nothing), never added to a study started without it.
        asked = [t for t in self.study.trials if t.user_attrs.get("defaults")]
        if enqueue_defaults and (not self.study.trials or asked and all(never_trained(t) for t in asked)):
            self.study.enqueue_trial(defaults, user_attrs={"defaults": True})
        # Trials left running by a killed tuning command are run again with their own values (their runs
        # resume from checkpoints). So one tuning command per study at a time (study_lock, held by the sweeper):
        # a second would take the first's running trials for stale. Optuna offers no public handle on a stored
        # running trial other than Trial(study, trial_id); the id is FrozenTrial's _trial_id.
        import optuna.trial

        self.stale = [optuna.trial.Trial(self.study, t._trial_id) for t in self.study.trials
                      if t.state == optuna.trial.TrialState.RUNNING]

    def finished(self) -> int:
        """Trials that count towards n_trials: complete, pruned, or failed after training. A trial whose runs failed
        before their first env step (its jobs refused: see refuse_untrained_batch) cost nothing and is kept in the
        study as failed, uncounted."""
        return sum(counted(t) for t in self.study.trials)

    def spent_env_steps(self) -> int:
        """Env steps the finished trials trained, over all their runs (pruned trials count what they ran)."""
        return sum(int(t.user_attrs.get("env_steps", 0)) for t in self.study.trials if t.state.is_finished())

    def budget_left(self) -> bool:
        if self.finished() >= self.n_trials:
            return False
        return self.env_step_budget is None or self.spent_env_steps() < self.env_step_budget

    def next_trials(self) -> list:
        """The next batch: stale trials first, then new ones, until n_trials have finished."""
        import optuna

        if self.stale:
            trials, self.stale = self.stale, []
            return trials
        wanted = min(self.trials_per_batch, self.n_trials - self.finished())
        if wanted <= 0 or not self.budget_left():
            return []
        if self.env_step_budget is not None:  # no more trials than the budget left would train unpruned: a study
            # ends within one trial's full cost of its budget, not a whole batch's
            full = max(1, len(self.tasks) * len(self.seeds) * int(self.config.total_steps))
            wanted = min(wanted, math.ceil((self.env_step_budget - self.spent_env_steps()) / full))
        # Seeded per batch from the number of finished trials (uncounted ones too, so that a batch after refused
        # trials asks other values): the same history asks the same values, whether or not the tuning command was
        # killed and resumed in between.
        finished = sum(t.state.is_finished() for t in self.study.get_trials(deepcopy=False))
        self.study.sampler = optuna.samplers.TPESampler(
            seed=self.sampler_seed + finished, n_startup_trials=self.n_startup_trials, constant_liar=True,
            multivariate=True)
        trials = []
        for _ in range(10 * wanted):  # bounded: a small discrete space may hold no new values
            if len(trials) == wanted:
                break
            trial = self.study.ask(self.space)
            repeated = self.repeats(trial)
            if repeated is None:
                trials.append(trial)
                continue
            # Another trial's values with the same tuning seeds would train the same runs again: told failed
            # before its first env step (so uncounted, like a refused trial), and the sampler asked again.
            trial.set_user_attr("repeats_trial", repeated)
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            print(f"trial {trial.number} would repeat trial {repeated}'s values: not trained, not counted; asking "
                  f"again")
        if not trials:  # an empty batch ends the study (the sweeper asks no more)
            print(f"the search space gave no new values in {10 * wanted} asks: the study asks no more")
        elif len(trials) < wanted:
            print(f"the search space gave {len(trials)} new value(s) in {10 * wanted} asks: a batch of {len(trials)}")
        return trials

    def repeats(self, trial) -> int | None:
        """The number of an earlier trial (trained, or training) asked with these values as a values file writes
        them (yaml_scalar: floats at 4 significant digits, so that `apply` could not tell the two apart), else None.
        Trial 0 runs the values file's rounded values, and a sampler seeded as the round it came from draws them
        again unrounded."""
        def written(params: dict) -> dict:
            return {key: yaml_scalar(value) for key, value in params.items()}

        asked = written(trial.params)
        for other in self.study.get_trials(deepcopy=False):
            if other.number != trial.number and not never_trained(other) and written(other.params) == asked:
                return other.number
        return None

    def run_dir(self, trial, task: str, seed: int) -> Path:
        return self.sweep_dir / trial_dir(trial) / task / f"seed{seed}"

    def job_overrides(self, trial, arguments: list[str], rung: int | None = None) -> list[list[str]]:
        """The trial's jobs, to train to `rung` env steps (pause_at_steps) or, with None, to the end."""
        values = [f"{key}={override_value(trial.params[key])}" for key in self.space]
        pause = [] if rung is None or rung >= self.rungs[-1] else [f"pause_at_steps={rung}"]
        if self.population:  # one job per task; its seeds write beside the job's directory (seed_run_dirs)
            from benchmarks.engine.validate import seed_dir

            seeds = ",".join(map(str, self.seeds))
            return [[*arguments, f"env={task}", f"seeds=[{seeds}]", *values, *pause,
                     f"hydra.sweep.subdir={trial_dir(trial)}/{task}/{seed_dir(None, self.seeds)}"]
                    for task in self.tasks]
        return [[*arguments, f"env={task}", f"seed={seed}", *values, *pause,
                 f"hydra.sweep.subdir={self.run_dir(trial, task, seed).relative_to(self.sweep_dir)}"]
                for task in self.tasks for seed in self.seeds]

    def run_dirs(self, trial) -> dict[str, Path]:
        return {f"{task}/seed{seed}": self.run_dir(trial, task, seed) for task in self.tasks for seed in self.seeds}

    def scores(self, trial, rung: int | None) -> tuple[dict[str, float], list[str]]:
        """Each run's normalised AUC (so far, at a rung below the budget), and the runs that could not be read."""
        scores, problems = {}, []
        paused_at = rung if rung is not None and rung < self.rungs[-1] else None
        for name, run_dir in self.run_dirs(trial).items():
            try:
                scores[name] = normalised_auc(run_dir, paused_at=paused_at)
            except RunNotComplete as problem:
                problems.append(str(problem))
        return scores, problems

    def judge_at_rung(self, trial, rung: int) -> bool:
        """Report the trial's objective so far at this rung; True if it goes on, False if it ended here
        (pruned by successive halving, or failed)."""
        import optuna

        scores, problems = self.scores(trial, rung)
        if problems or not scores:
            self.finish(trial, problems)  # fails it, with the problems met at this rung (not its paused runs')
            return False
        # a trial resumed after a stop reported its earlier rungs already (Optuna would keep the first and warn)
        if rung not in self.study.trials[trial.number].intermediate_values:
            trial.report(float(np.mean(list(scores.values()))), step=rung)
        if not trial.should_prune():
            return True
        self.record_spent(trial)
        self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        print(f"trial {trial.number} pruned at {rung} env steps: normalised AUC so far "
              f"{np.mean(list(scores.values())):.4f} with {trial.params}")
        return False

    def record_spent(self, trial) -> None:
        runs = self.run_dirs(trial).values()
        trial.set_user_attr("env_steps", sum(trained_env_steps(run_dir) for run_dir in runs))
        trial.set_user_attr("train_seconds", sum(training_seconds(run_dir) for run_dir in runs))

    def finish(self, trial, problems: list[str] | None = None) -> None:
        """Tell the trial its objective over its whole runs, or failed: with `problems`, those met at a rung."""
        import optuna

        scores, found = self.scores(trial, None)
        problems = found if problems is None else problems or ["no run was scored"]
        for name, score in scores.items():
            trial.set_user_attr(name, score)
        self.record_spent(trial)
        if problems or not scores:
            # Counts towards n_trials (equal budgets) but not as a value TPE learns from.
            trial.set_user_attr("failed_runs", problems)
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            print(f"trial {trial.number} failed: {'; '.join(problems)}")
            return
        value = float(np.mean(list(scores.values())))
        self.study.tell(trial, value)
        print(f"trial {trial.number}: normalised AUC {value:.4f} "
              f"({', '.join(f'{k} {v:.3f}' for k, v in scores.items())}) with {trial.params}")

    def refuse_untrained_batch(self, batch: list) -> None:
        """Stop the command when no trial of a batch trained a single env step: their jobs were refused (a config
        error, their values outside what the validator allows, or code changed under a running study), and new
        trials would likely fail the same way at once."""
        stored = {t.number: t for t in self.study.get_trials(deepcopy=False)}
        if batch and all(never_trained(stored[trial.number]) for trial in batch):
            problem = (stored[batch[0].number].user_attrs.get("failed_runs") or ["no run started"])[0]
            raise SystemExit(f"error: no trial of the batch ({', '.join(str(t.number) for t in batch)}) trained an "
                             f"env step: their jobs were refused ({problem}); see the jobs' output above. Fix the "
                             f"config and rerun the same command to go on with the study (refused trials are not "
                             f"counted); values the search space itself makes invalid need a new study")

    def log_summary(self) -> None:
        import optuna

        if not has_complete_trial(self.study):
            print(f"study {self.study.study_name}: {self.finished()} trials finished, none complete")
            return
        best = self.study.best_trial
        pruned = sum(t.state == optuna.trial.TrialState.PRUNED for t in self.study.trials)
        print(f"study {self.study.study_name}: {self.finished()} trials finished ({pruned} pruned, "
              f"{self.spent_env_steps():,} env steps); best trial {best.number}: "
              f"normalised AUC {best.value:.4f} with {best.params}")


# ---------------------------------------------------------------------------
# apply: best values -> conf/
# ---------------------------------------------------------------------------


def tune_config(tune: str) -> dict:
    """conf/tune/<tune>.yaml's settings (storage, tasks, the values file the result is written to).

    Composed by Hydra as a tuning command composes them, so a round that extends another
    (conf/tune/mujoco_300k.yaml includes mujoco.yaml) reads the same merged settings.
    """
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base=None):
        config = compose("config", overrides=["hydra/sweeper=tune", f"+tune={tune}"], return_hydra_config=True)
    return {"hydra": {"sweeper": OmegaConf.to_container(config.hydra.sweeper, resolve=False)}}


def sqlite_file(storage: str) -> Path | None:
    """The database file of an sqlite:/// storage URL (relative: to the current directory), else None."""
    return Path(storage.removeprefix("sqlite:///")) if storage.startswith("sqlite:///") else None


def existing_storage(storage: str) -> str:
    """The storage, if its database exists (reading a missing SQLite file would create an empty one), else the one
    line that says it does not (a relative file is read from the current directory, where run.py writes it)."""
    path = sqlite_file(storage)
    if path is not None and not path.exists():
        where = "" if path.is_absolute() else f" under {Path.cwd()} (a study writes it where run.py ran)"
        raise SystemExit(f"error: no study database {path}{where}")
    return storage


def load_study(storage: str, study_name: str):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    names = optuna.get_all_study_names(storage=existing_storage(storage))
    if study_name not in names:
        raise SystemExit(f"error: no study {study_name!r} in {storage} (have: {', '.join(sorted(names)) or 'none'})")
    return optuna.load_study(study_name=study_name, storage=storage)


def find_key_line(lines: list[str], dotted: list[str]) -> int:
    """Index of the line holding the last key of `dotted` in a plain block-style YAML file (2-space indents)."""
    low, high = 0, len(lines)
    for depth, part in enumerate(dotted):
        pattern = re.compile(rf"^{' ' * 2 * depth}{re.escape(part)}:(\s|$)")
        try:
            found = next(i for i in range(low, high) if pattern.match(lines[i]))
        except StopIteration:
            raise KeyError(f"no key {'.'.join(dotted[:depth + 1])}") from None
        # the block of this key ends at the next line indented as much or less (comments aside)
        low, high = found + 1, next((i for i in range(found + 1, high) if lines[i].strip()
                                     and not lines[i].lstrip().startswith("#")
                                     and len(lines[i]) - len(lines[i].lstrip()) <= 2 * depth), high)
    return found


def set_yaml_value(path: Path, dotted: str, value: Any) -> None:
    """Replace the value at `dotted` (e.g. tuned.outer_ppo.outer_lr) in a YAML file, keeping comments."""
    lines = path.read_text().splitlines(keepends=True)
    try:
        index = find_key_line(lines, dotted.split("."))
    except KeyError as error:
        raise KeyError(f"{path}: {error.args[0]}") from None
    match = re.match(r"^(\s*[^:#]+:\s*)([^#\n]*?)(\s*#.*)?\n?$", lines[index])
    lines[index] = f"{match.group(1)}{yaml_scalar(value)}{match.group(3) or ''}\n"
    path.write_text("".join(lines))


def set_provenance(path: Path, dotted: str, text: str) -> None:
    """One `# tuned: ...` comment line directly above the block `dotted`, replaced on every apply."""
    lines = path.read_text().splitlines(keepends=True)
    index = find_key_line(lines, dotted.split("."))
    indent = " " * (2 * dotted.count("."))
    if index > 0 and lines[index - 1].strip().startswith("# tuned:"):
        lines[index - 1] = f"{indent}# tuned: {text}\n"
    else:
        lines.insert(index, f"{indent}# tuned: {text}\n")
    path.write_text("".join(lines))


def yaml_scalar(value: Any) -> str:
    """4 significant digits; exponents keep a decimal point ('1.0e-05'), which every YAML loader reads as a float."""
    if isinstance(value, float):
        text = f"{value:.4g}"
        mantissa, _, exponent = text.partition("e")
        if exponent and "." not in mantissa:
            text = f"{mantissa}.0e{exponent}"
        return text if ("." in text or "e" in text) else text + ".0"
    if isinstance(value, bool):
        return str(value).lower()
    text = "null" if value is None else str(value)
    if isinstance(value, str):
        try:
            read = OmegaConf.to_container(OmegaConf.create(f"value: {text}"))["value"]
        except Exception:  # YAML cannot read it bare
            read = None
        if not same_typed(read, value):
            return json.dumps(value)  # a string YAML would read as another type (yes, null, 1e-3) or not at all
    return text


def same_value(a: Any, b: Any) -> bool:
    """Equal, floats as written by yaml_scalar (4 significant digits)."""
    if isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        return math.isclose(a, b, rel_tol=1e-3, abs_tol=1e-12)
    return a == b


def planned_values(tune: str, sweeper: dict, algo: str, storage: str) -> tuple[dict, str, list[str]]:
    """Study `algo`'s best values, the provenance line apply writes above them, and why the tuning's values file
    (its sweeper's values_file) cannot take them: one `error:` line each, empty when it can."""
    study = load_study(storage, algo)
    if not has_complete_trial(study):
        return {}, "", [f"error: study {algo} in {storage} has no complete trial yet (of {len(study.trials)}): "
                        f"nothing to apply"]
    best = study.best_trial
    finished = sum(counted(t) for t in study.trials)  # as the report counts
    provenance = (f"study {algo} in {storage.removeprefix('sqlite:///')}, best of {finished} trials "
                  f"(trial {best.number}, normalised AUC {best.value:.4f}; python -m benchmarks.tuning apply "
                  f"--tune {tune} --algo {algo})")
    lines, problems = (PROJECT_ROOT / sweeper["values_file"]).read_text().splitlines(keepends=True), []
    for key in best.params:
        if not is_preset_value(key):
            problems.append(f"error: study {algo} searched {key}: a values file holds env.hparams and env.tuned values "
                            f"only (what the presets read); pass it as {key}={override_value(best.params[key])}, or "
                            f"write it into the preset")
            continue
        try:
            find_key_line(lines, key.split(".")[1:])
        except KeyError as error:
            problems.append(f"error: {sweeper['values_file']} has {error.args[0]}: add it there (with the preset's "
                            f"value so far) and apply again")
    return best.params, provenance, problems


def apply_best(tune: str, algos: list[str], storage: str | None = None) -> dict[str, dict]:
    """Write the best trial's values of each study in `algos`, in order, into the tuning's values file.

    That file is a config of the `tuning` group (package env): `python run.py ... +tuning=<name>` runs
    with every value it holds; conf/env_family/<family>.yaml can list it to make it the family default.
    Every study is read and every key checked before the file is touched: a refused apply leaves it as it was.
    """
    sweeper = tune_config(tune)["hydra"]["sweeper"]
    path = PROJECT_ROOT / sweeper["values_file"]
    planned = {algo: planned_values(tune, sweeper, algo, storage or sweeper["storage"]) for algo in algos}
    problems = [problem for _, _, algo_problems in planned.values() for problem in algo_problems]
    if problems:
        raise SystemExit("\n".join(problems))
    for algo, (params, provenance, _) in planned.items():
        blocks = set()
        for key, value in params.items():
            parts = key.split(".")
            set_yaml_value(path, ".".join(parts[1:]), value)
            blocks.add(".".join(parts[1:-1]))
        for block in sorted(blocks):
            set_provenance(path, block, provenance)
        print(f"applied {algo} to {sweeper['values_file']}: {params} ({provenance})")
    return {algo: params for algo, (params, _, _) in planned.items()}


def study_provenance(config: dict) -> tuple[str, tuple] | None:
    """(budget text, tuning tasks) of the study whose best values this run config used; None if untuned.

    Studies are looked up in the tuning rounds of the run's task family, results/tuning/<family>*.db
    (mujoco.db, mujoco_300k.db; classic and classic_continuous share classic*.db); the run used a
    round's study if every best value of it and of that round's PPO study is the value at the same
    key of its config (env.hparams.* for PPO's core, env.tuned.<preset>.* else).
    """
    found = used_study(config)
    return None if found is None else (budget_text(found[1]), tuple(found[1].user_attrs["base"]["tasks"]))


def used_study(config: dict) -> tuple[Path, Any] | None:
    """(database, StoredStudy) of the preset's study whose best values this run config used (study_provenance's
    rule); None if untuned. The study's best_trial.params names the keys it tuned."""
    family = {"classic_continuous": "classic"}.get(config["env"]["family"], config["env"]["family"])
    matches = [(database, study) for database in sorted((PROJECT_ROOT / "results" / "tuning").glob(f"{family}*.db"))
               if (study := round_study(database, config)) is not None]
    # A study whose best trial is still its first (trial 0: the values it started from, another round's) has tuned
    # nothing yet: the round that found those values is the run's source.
    tuned = [match for match in matches if not match[1].best_trial.user_attrs.get("defaults")]
    return (tuned or matches)[0] if matches else None


def budget_text(study) -> str:
    """A study's tuning budget: trials x tasks x seeds x env steps per trial; a pruned study's trials are named
    with how many stopped early and the env steps all of them trained (its budget is counted in env steps). Trials
    that never trained (counted()) are not counted."""
    import optuna

    base = study.user_attrs["base"]
    trials = [t for t in study.trials if counted(t)]
    seeds = len(base["seeds"])
    tasks = len(base["tasks"])
    text = (f"{len(trials)} trial{'s' * (len(trials) != 1)} x {tasks} task{'s' * (tasks != 1)} x {seeds} "
            f"seed{'s' * (seeds != 1)} x {base['total_steps'] // 1000}k steps")
    pruned = sum(t.state == optuna.trial.TrialState.PRUNED for t in trials)
    if pruned:
        spent = sum(int(t.user_attrs.get("env_steps", 0)) for t in trials)
        text += f" at most ({pruned} pruned early; {spent / 1e6:.1f}M env steps trained in all)"
    return text


def round_study(database: Path, config: dict):
    """used_study for the studies of one database (one tuning round): the preset's study, or None."""
    preset = config["algo"]["name"]
    cached = _studies_cache.get(database)
    if cached is None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage = f"sqlite:///{database}"
        cached = {s.study_name: StoredStudy(load_study(storage, s.study_name))
                  for s in optuna.get_all_study_summaries(storage)}
        _studies_cache[database] = cached

    def used_best(study) -> bool:
        try:
            params = study.best_trial.params
        except ValueError:  # no complete trial
            return False
        try:
            return all(same_value(value, get_dotted(config, key)) for key, value in params.items())
        except KeyError:  # a key the run's config does not have: it did not use this study
            return False

    studies = [cached[name] for name in ("ppo", preset) if name in cached]
    if preset not in cached or not all(used_best(study) for study in studies):
        return None
    return cached[preset]


class StoredStudy:
    """A study's name, attributes, trials and best trial, read from its database once: the claims table asks which
    study each of hundreds of runs used, and every question would otherwise read the database again."""

    def __init__(self, study):
        self.study_name, self.user_attrs, self.trials = study.study_name, study.user_attrs, study.trials
        try:
            self._best_trial = study.best_trial
        except ValueError:  # no complete trial
            self._best_trial = None

    @property
    def best_trial(self):
        if self._best_trial is None:
            raise ValueError(f"study {self.study_name!r} has no complete trial")
        return self._best_trial


_studies_cache: dict[Path, dict[str, StoredStudy]] = {}


# ---------------------------------------------------------------------------
# report: one table of all studies, one sensitivity figure per study
# ---------------------------------------------------------------------------


def study_rows(tune: str, storage: str | None = None) -> list[dict]:
    import optuna

    storage = storage or tune_config(tune)["hydra"]["sweeper"]["storage"]
    rows = []
    for summary in optuna.get_all_study_summaries(storage=existing_storage(storage)):
        study = load_study(storage, summary.study_name)
        trials = [t for t in study.trials if counted(t)]
        complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
        defaults = [t for t in complete if t.user_attrs.get("defaults")]
        best = max(complete, key=lambda t: t.value) if complete else None
        pruned = [t for t in trials if t.state == optuna.trial.TrialState.PRUNED]
        rows.append({
            "preset": summary.study_name, "trials": len(trials), "pruned": len(pruned),
            "failed": len(trials) - len(complete) - len(pruned),
            # failed before their first env step, uncounted: refused jobs, or values a trial had already trained
            "refused": sum(never_trained(t) and "repeats_trial" not in t.user_attrs for t in study.trials),
            "repeated": sum("repeats_trial" in t.user_attrs for t in study.trials),
            "unfinished": sum(t.state == optuna.trial.TrialState.RUNNING for t in study.trials),
            "env_steps": sum(int(t.user_attrs.get("env_steps", 0)) for t in trials),
            # training time on one core per process, of the trials that recorded it (studies before it was: none)
            "cpu_hours": sum(float(t.user_attrs.get("train_seconds", 0.0)) for t in trials) / 3600,
            "timed_trials": sum("train_seconds" in t.user_attrs for t in trials),
            "default_auc": defaults[0].value if defaults else math.nan,
            "best_auc": best.value if best else math.nan, "best_trial": best.number if best else None,
            "best_params": best.params if best else {}, "study": study,
        })
    return rows


def report(tune: str, out: Path, storage: str | None = None) -> None:
    """Every study of the round's storage into <out>/<tune>.md and its figures; or of `storage` (a study run with
    hydra.sweeper.storage=...), named after its SQLite file (my_study.md), so that no round's report is written over."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "ppo-variants-bench"  # stable SVG ids: unchanged figures stay identical

    rows = study_rows(tune, storage)
    base = rows[0]["study"].user_attrs.get("base", {}) if rows else {}
    lines = [f"# Tuning studies: {tune}" + (f" ({storage})" if storage else ""), "",
             f"Objective: normalised area under the evaluation curve, mean over tuning tasks "
             f"{base.get('tasks')} x tuning seeds {base.get('seeds')}, {base.get('total_steps')} env steps per run. "
             f"Trial 0 of every study is the preset's values before tuning ('default'). `unfinished`: trials "
             f"started and not finished (a resumed study runs them again); `env steps`: trained by the finished "
             f"trials, over all their runs; `CPU-hours`: their training processes' time on one core each "
             f"(of the trials that recorded it, counted beside it when not all did).", "",
             "| preset | trials (pruned, failed) | unfinished | env steps | CPU-hours | default | best | best trial | "
             "best values |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        params = ", ".join(f"{k.split('.')[-1]}={yaml_scalar(v)}" for k, v in row["best_params"].items())
        spent = f"{row['env_steps']:,}" if row["env_steps"] else "-"  # (studies before it was recorded: -)
        hours = "-" if not row["timed_trials"] else f"{row['cpu_hours']:.2f}" + (
            f" ({row['timed_trials']} of {row['trials']} trials)" if row["timed_trials"] < row["trials"] else "")
        lines.append(f"| {row['preset']} | {row['trials']} ({row['pruned']}, {row['failed']}) | {row['unfinished']} | "
                     f"{spent} | {hours} | "
                     f"{row['default_auc']:.4f} | {row['best_auc']:.4f} | {row['best_trial']} | {params} |")
    refused = [f"{row['preset']} {row['refused']}" for row in rows if row["refused"]]
    if refused:
        lines += ["", f"Not counted above: trials that failed before their first env step (their jobs refused: they "
                      f"trained nothing and are kept in the study as failed): {', '.join(refused)}."]
    repeated = [f"{row['preset']} {row['repeated']}" for row in rows if row["repeated"]]
    if repeated:
        lines += ["", f"Not counted above either: trials asked with values an earlier trial had trained (told failed, "
                      f"not trained): {', '.join(repeated)}."]
    for row in rows:
        if row["pruned"]:
            lines += ["", *trial_lines(row["study"])]
    out.mkdir(parents=True, exist_ok=True)
    database = sqlite_file(storage) if storage else None
    name = database.stem if database is not None else tune
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))

    import optuna

    for row in rows:
        complete = [t for t in row["study"].trials if t.state == optuna.trial.TrialState.COMPLETE]
        space = row["study"].user_attrs.get("base", {}).get("search_space", {})
        if complete and space:
            sensitivity_figure(name, row, complete, space, out)


def trial_lines(study) -> list[str]:
    """Every finished trial of a pruned study: how far it trained and its objective there (a pruned trial's at the
    last rung it reached), with its values: what the search saw, not only where it ended."""
    trials = [t for t in study.trials if counted(t)]
    total = study.user_attrs.get("base", {}).get("total_steps", 0)  # what a trial that was never pruned trained
    keys = list(dict.fromkeys(key for t in trials for key in t.params))
    lines = [f"{study.study_name}: every finished trial (objective at the last env step it was judged at)", "",
             "| trial | state | env steps per run | objective | " + " | ".join(key.split(".")[-1] for key in keys) + " |",
             "|---" * (4 + len(keys)) + "|"]
    for t in trials:
        if t.state.name == "COMPLETE":
            step, value = total, t.value
        elif t.intermediate_values:  # pruned (or failed) after a rung: the last one it was judged at
            step, value = max(t.intermediate_values.items())
        else:
            step, value = None, None
        objective = "-" if value is None else f"{value:.4f}"
        step = "-" if step is None else f"{step:,}"
        values = " | ".join(yaml_scalar(t.params[key]) if key in t.params else "-" for key in keys)
        lines.append(f"| {t.number} | {t.state.name.lower()} | {step} | {objective} | {values} |")
    return lines


def sensitivity_figure(tune: str, row: dict, complete: list, space: dict, out: Path) -> None:
    """Objective against each tuned value: every trial, the preset before tuning (ring) and the best (star)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    fig, axes = plt.subplots(1, len(space), figsize=(max(2.7 * len(space), 5.4), 2.9), sharey=True, squeeze=False)
    values = [t.value for t in complete]
    before = [t for t in complete if t.user_attrs.get("defaults")]
    best = max(complete, key=lambda t: t.value)
    for ax, (key, spec) in zip(axes[0], space.items()):
        choices = spec.get("choices")

        def position(value, choices=choices):
            return choices.index(value) if choices else value

        ax.scatter([position(t.params[key]) for t in complete], values, s=18, color="#4477AA", alpha=0.8,
                   label="trial")
        if before:
            ax.scatter([position(before[0].params[key])], [before[0].value], s=70, facecolors="none",
                       edgecolors="black", label="before tuning")
        ax.scatter([position(best.params[key])], [best.value], s=90, marker="*", color="#EE6677", label="best")
        if choices:
            ax.set_xticks(range(len(choices)), [yaml_scalar(c) for c in choices], fontsize=7)
            ax.set_xlim(-0.5, len(choices) - 0.5)
        elif spec.get("log"):
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(key.split(".")[-1], fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("normalised AUC (tuning tasks)", fontsize=8)
    axes[0][0].legend(fontsize=6, loc="best")
    fig.suptitle(f"{tune}: {row['preset']}, {len(complete)} trials - objective against each tuned value", fontsize=9)
    from benchmarks.report import save_figure

    save_figure(fig, out / f"{tune}_{row['preset']}_sensitivity", dpi=120)  # no date stamp in the SVG


# ---------------------------------------------------------------------------
# transfer: did tuning help at the final evaluation's budget? (tuned suite vs the same suite untuned)
# ---------------------------------------------------------------------------


def transfer_table(tuned_root: Path, untuned_root: Path) -> pd.DataFrame:
    """Per preset: final return of the tuned and the untuned suite per task, and P(tuned > untuned) over tasks."""
    from benchmarks.runs import eval_curves
    from benchmarks.statistics import probability_of_improvement
    from benchmarks.runs import load_runs

    def finals(root: Path) -> dict:
        grouped: dict = {}
        for run in load_runs(root):
            grouped.setdefault((run["algo"], run["env"]), []).append(run)
        return {key: eval_curves(sorted(group, key=lambda r: r["seed"])).iloc[-1].to_numpy()
                for key, group in grouped.items()}

    tuned, untuned = finals(tuned_root), finals(untuned_root)
    rows = []
    for algo in dict.fromkeys(a for a, _ in tuned):
        tasks = sorted(t for a, t in tuned if a == algo and (algo, t) in untuned
                       and min(len(tuned[(a, t)]), len(untuned[(a, t)])) >= 3)
        if not tasks:
            continue
        seeds = min(min(len(tuned[(algo, t)]), len(untuned[(algo, t)])) for t in tasks)
        ours = np.stack([tuned[(algo, t)][:seeds] for t in tasks], axis=1)
        before = np.stack([untuned[(algo, t)][:seeds] for t in tasks], axis=1)
        point, low, high = probability_of_improvement(ours, before)
        rows.append({"preset": algo, "seeds": seeds,
                     **{f"{t} untuned -> tuned": f"{b:.0f} -> {o:.0f}" for t, o, b in
                        zip(tasks, ours.mean(axis=0), before.mean(axis=0))},
                     "P(tuned > untuned) [95% CI]": f"{point:.2f} [{low:.2f}, {high:.2f}]"})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    apply = commands.add_parser("apply", help="write a study's best values into conf/")
    apply.add_argument("--tune", type=conf_name("tune"), required=True,
                       help="conf/tune/<name>.yaml of the study (e.g. mujoco)")
    apply.add_argument("--algo", required=True, nargs="+", help="preset(s) whose study to apply")
    apply.add_argument("--storage", help="another storage than the tuning config's (e.g. a study run elsewhere)")
    show = commands.add_parser("report", help="table and sensitivity figures of every study of a tuning config")
    show.add_argument("--tune", type=conf_name("tune"), required=True)
    show.add_argument("--storage", help="another storage than the tuning config's (a study run with "
                                        "hydra.sweeper.storage=...): its report, named after its SQLite file, goes "
                                        "beside it")
    show.add_argument("--out", type=Path, help="directory to write <tune>.md (<database>.md with --storage) and the "
                                               "figures to (default: results/tuning, or beside --storage's file)")
    transfer = commands.add_parser("transfer", help="tuned suite against the same suite untuned, final returns")
    transfer.add_argument("--tuned", type=suite_directory, required=True)
    transfer.add_argument("--untuned", type=suite_directory, required=True)
    transfer.add_argument("--out", type=Path, required=True, help="markdown file to write")
    args = parser.parse_args(argv)
    if args.command == "transfer":
        table = transfer_table(args.tuned, args.untuned)
        if table.empty:
            transfer.error(f"no preset has complete runs of a task in both {args.tuned} and {args.untuned} with at least "
                         f"3 seeds each: nothing to compare")
        text = (f"# Did tuning help at the final budget?\n\nFinal evaluation return (mean over the first k seeds both "
                f"suites have), tuned suite {args.tuned} against untuned suite {args.untuned}; P(tuned > untuned) is "
                f"rliable's probability of improvement over tasks with a 95% stratified-bootstrap CI. Table by "
                f"`python -m benchmarks.tuning transfer --tuned {args.tuned} --untuned {args.untuned} "
                f"--out {args.out}`.\n\n" + table.to_markdown(index=False) + "\n")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(text)
    elif args.command == "apply":
        apply_best(args.tune, args.algo, args.storage)
    else:
        out, own = args.out, sqlite_file(tune_config(args.tune)["hydra"]["sweeper"]["storage"])
        database = sqlite_file(args.storage) if args.storage is not None else None
        if database is not None and own is not None and database.resolve() == own.resolve():
            args.storage = None  # the round's own database: its own report
        if out is None and args.storage is None:
            out = PROJECT_ROOT / "results" / "tuning"
        elif out is None:  # not over the round's committed report
            if database is None:
                show.error(f"--storage {args.storage} is no SQLite file to write beside: give --out")
            out = database.parent
        report(args.tune, out, args.storage)


if __name__ == "__main__":
    main()
