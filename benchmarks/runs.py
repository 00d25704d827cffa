"""Reading stored runs: a run directory's status (read_summary), the complete runs under a root (load_runs),
and their grouping by task and preset (group_runs)."""

from __future__ import annotations

import copy
import functools
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks.engine.logger import read_csv_complete_rows

if TYPE_CHECKING:
    import pandas as pd  # imported where used: a training process reads LOCK_FILE here, and pandas takes 0.4 s


# The file a training process holds while it trains in a run directory (benchmarks/engine/run_dir.py run_lock):
# its pid inside, removed as the lock is released.
LOCK_FILE = ".lock"

# What the readers of a run take from its summary.json, and from the config stored in it (every run the trainer
# writes has them; a key a stored run predates is filled by benchmarks.engine.config.with_later_keys)
REQUIRED_SUMMARY_KEYS = ("status", "env", "algo", "seed", "env_steps", "sps", "config")
REQUIRED_CONFIG_KEYS = ("env.name", "env.id", "env.family", "algo.name", "algo.algorithm")
# CleanRL's metric: the mean return of a run's last 100 training episodes (also all a packed suite keeps of its
# episodes log, benchmarks/pack.py)
LAST_EPISODES = 100


CONF_ENV = Path(__file__).resolve().parents[1] / "conf" / "env"


def holds_tasks(path: Path) -> bool:
    """Whether a folder is laid out as a suite: <suite>/<task>/<preset>/..., a task being a conf/env/<task>.yaml."""
    return any(child.is_dir() and (CONF_ENV / f"{child.name}.yaml").exists() for child in path.iterdir())


def numeric_log(path: Path, columns: tuple[str, ...], rows_required: bool = True):
    """A metrics CSV whose `columns` are present, numeric and finite-or-NaN (ValueError naming the problem).
    rows_required=False: a log that may hold no row (episodes.csv of a run that finished no training episode)."""
    log = read_csv_complete_rows(path)
    missing = [c for c in columns if c not in log.columns]
    if missing:
        raise ValueError(f"{path.name} lacks {', '.join(missing)}")
    if log.empty:
        if rows_required:
            raise ValueError(f"{path.name} has no rows")
        return log.astype(float)  # a header alone reads as text columns
    from pandas.api.types import is_numeric_dtype

    for column in columns:
        if not is_numeric_dtype(log[column]):
            raise ValueError(f"{path.name}: column {column} is not numeric (damaged rows)")
    return log


def last_episodes_mean(run: dict) -> float:
    """A run's mean return over its last LAST_EPISODES training episodes (CleanRL's metric)."""
    return float(run["episodes"]["episode_return"].tail(LAST_EPISODES).mean())


def eval_curves(group: list[dict]) -> pd.DataFrame:
    """Eval return per seed (columns) on the env steps every seed evaluated at (rows)."""
    import numpy as np
    import pandas as pd

    steps = [run["eval"]["env_steps"].to_numpy() for run in group]
    seeds = [run["seed"] for run in group]
    if seeds and len(set(seeds)) == len(seeds) and all(np.array_equal(steps[0], other) for other in steps[1:]):
        # the usual case (each seed once, evaluated at the same steps), without pandas' alignment
        returns = np.column_stack([run["eval"]["eval_return_mean"].to_numpy() for run in group])
        curves = pd.DataFrame(returns, index=pd.Index(steps[0], name="env_steps"), columns=seeds)
    else:
        curves = pd.concat({run["seed"]: run["eval"].set_index("env_steps")["eval_return_mean"] for run in group},
                           axis=1)
    return curves.dropna().sort_index()


def read_summary(run_dir: Path) -> dict:
    """A run's summary.json, the one place its status is read. Always a mapping with a "status":
    complete, failed (with "error"), interrupted (with "signal" and "env_steps") as the run wrote it; or,
    when there is no usable file, "partial" (none yet: running, or killed) or "corrupt" (with "error")."""
    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    except FileNotFoundError:
        return {"status": "partial", "error": "no summary.json (running, or killed: rerun its command to resume)"}
    except (OSError, json.JSONDecodeError) as error:
        return {"status": "corrupt", "error": f"corrupt summary.json ({type(error).__name__})"}
    if not isinstance(summary, dict):
        return {"status": "corrupt", "error": "corrupt summary.json (not a mapping)"}
    return summary


def why_not_complete(summary: dict) -> str | None:
    """None for a complete run, else one line saying why it is not (for skip lists and failure reports)."""
    status = summary.get("status")
    if status == "complete":
        return None
    if status in ("partial", "corrupt"):
        return summary["error"] if status == "corrupt" else f"partial: {summary['error']}"
    if status == "failed":
        return f"failed: {summary.get('error', 'no reason recorded')}"
    if status == "paused":
        return f"paused at {summary.get('env_steps')} env steps (pause_at_steps; resumable)"
    if status == "interrupted":
        return f"interrupted by {summary.get('signal')} at {summary.get('env_steps')} env steps (resumable)"
    return f"unknown status {status!r}"


def trainer_pid(run_dir: Path) -> int | None:
    """The pid of the live process training in run_dir, if one is (read from its lock file, which is never locked
    here: a reader must not make a starting trainer think the directory is taken)."""
    try:
        pid = int((Path(run_dir) / LOCK_FILE).read_text().strip())
    except (OSError, ValueError):  # no lock file, or one being written
        return None
    if pid <= 0:  # os.kill(0 or -1, 0) asks about process groups
        return None
    try:
        os.kill(pid, 0)  # signal 0: is it alive? (a killed trainer's file can stay behind)
    except PermissionError:
        return pid  # alive, another user's
    except OSError:
        return None
    return pid


def group_runs(runs: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """(env, algo) -> its runs in seed order; keys in sorted order. The one grouping every table uses."""
    grouped: dict[tuple[str, str], list[dict]] = {}
    for run in runs:
        grouped.setdefault((run["env"], run["algo"]), []).append(run)
    return {key: sorted(grouped[key], key=lambda run: run["seed"]) for key in sorted(grouped)}


def unequal_budgets(runs: list[dict]) -> str | None:
    """Where presets on one task trained different numbers of env steps (the protocol compares equal budgets),
    e.g. "CartPole (hp3o 1,024, ppo 2,048 env steps)"; None where every task's presets trained the same. A run's
    budget is the step of its last evaluation (the end of training: the tables' env steps)."""
    unequal = []
    for task in dict.fromkeys(run["env"] for run in runs):
        steps = {}
        for run in runs:
            if run["env"] == task:
                steps.setdefault(run["algo"], set()).add(int(run["eval"]["env_steps"].iloc[-1]))
        if len(set().union(*steps.values())) > 1:
            budgets = ", ".join(f"{algo} {'/'.join(f'{n:,}' for n in sorted(ns))}" for algo, ns in sorted(steps.items()))
            unequal.append(f"{task} ({budgets} env steps)")
    return "; ".join(unequal) or None


def compared_configuration(run: dict):
    """What makes two runs of a preset one configuration: its config as run.py compares them for skip and resume
    (numbers_relevant), less the seed and how the numbers were computed (device, threads, backend)."""
    from benchmarks.engine.config import numbers_relevant

    # load_runs leaves out a run whose config lacks its env and algo blocks (incomplete_summary)
    config = {k: v for k, v in numbers_relevant(run["config"]).items() if k not in ("seed", "seeds", "device",
                                                                                  "torch_threads")}
    config["algo"] = {k: v for k, v in config["algo"].items() if k != "backend"}
    return config


def keys_between(configs: list[dict]) -> list[str]:
    """The dotted keys in which some of these configurations differ."""
    from benchmarks.engine.config import differing_keys

    # a key two of them differ in differs from the first's in one of the two
    return sorted({key for other in configs[1:] for key in differing_keys(configs[0], other)})


def mixed_configurations(runs: list[dict], swept: tuple[str, ...] = ()) -> str | None:
    """None when each (task, preset) holds one run per seed, all of one configuration (compared_configuration);
    else one line naming two runs that are not, and the keys they differ in. A table's row, a curve's band and a
    verdict take the seeds of one configuration: the points of a sweep over algo.lr in one folder would otherwise
    be averaged as seeds. swept: the dotted keys a sweep's figure sets apart (its grid's axes, a frontier's KL
    coefficients): one configuration and one run per seed at each of their values."""
    def block_of(config: dict, key: str) -> tuple[dict, str]:  # the dict holding a dotted key, and its last name
        *parents, last = key.split(".")
        return functools.reduce(lambda node, name: node.get(name) or {}, parents, config), last

    def configuration(run: dict) -> dict:
        config = copy.deepcopy(compared_configuration(run))
        for key in swept:
            block, last = block_of(config, key)
            block.pop(last, None)
        return config

    def value(run: dict, key: str):
        block, last = block_of(run["config"], key)
        return block.get(last)

    for (env, algo), group in group_runs(runs).items():
        first = configuration(group[0])
        for run in group[1:]:
            if keys := keys_between([first, configuration(run)]):
                takes = (f"a figure over {', '.join(swept)} takes the seeds of one configuration at each of its "
                         f"points" if swept else "a table takes the seeds of one")
                return (f"{env}/{algo} holds runs of more than one configuration ({group[0]['dir']} and {run['dir']} "
                        f"differ in: {', '.join(keys)}): {takes}; name each configuration's directory on its own")
        points = [(tuple(value(run, key) for key in swept), run["seed"]) for run in group]
        if twice := [run for run, point in zip(group, points) if points.count(point) > 1]:
            return (f"{env}/{algo} holds seed {twice[0]['seed']} more than once ({twice[0]['dir']} and "
                    f"{twice[1]['dir']}, the same configuration): a table takes one run per seed; keep one")
    return None


def one_preset_per_configuration(runs: list[dict]) -> list[dict]:
    """The runs, a (task, preset) that holds runs of several configurations split into one preset per
    configuration, named by its values of the keys they differ in: `ppo (algo.lr=0.001)` - a sweep over a value
    of a preset, one row per point (benchmarks.summarize)."""
    from benchmarks.engine.validate import get_dotted

    def value(config: dict, key: str) -> str:
        try:
            return str(get_dotted(config, key))
        except KeyError:
            return "unset"

    split = []
    for (_, algo), group in group_runs(runs).items():
        configs = [compared_configuration(run) for run in group]
        keys = keys_between(configs)
        split += [{**run, "algo": f"{algo} ({','.join(f'{key}={value(config, key)}' for key in keys)})"} if keys
                  else run for run, config in zip(group, configs)]
    return split


def incomplete_summary(summary: dict) -> str | None:
    """Why a complete run's summary.json cannot be read (a key of REQUIRED_SUMMARY_KEYS or of
    REQUIRED_CONFIG_KEYS missing: a file edited or written by something else), or None."""
    missing = [key for key in REQUIRED_SUMMARY_KEYS if key not in summary]
    if missing:
        return f"corrupt summary.json (missing {', '.join(missing)})"
    sections = summary["config"] if isinstance(summary["config"], dict) else {}
    missing = []
    for key in REQUIRED_CONFIG_KEYS:
        section, name = key.split(".")
        if not isinstance(sections.get(section), dict) or name not in sections[section]:
            missing.append(key)
    return f"corrupt summary.json (its config has no {', '.join(missing)})" if missing else None


def trained_together(summary: dict) -> list[int]:
    """The seeds trained in the run's process, its own among them (a population's logs its whole loop's times)."""
    batched = summary.get("batched") or {}
    return batched.get("trained_together") or batched.get("seeds") or [summary.get("seed")]


def load_runs(root: Path, skipped: list[tuple[Path, str]] | None = None) -> list[dict]:
    """One dict per complete run: env, algo, seed, env_steps, sps, dir, config, and its eval/episodes tables.

    A run that is not complete - failed, interrupted, still running, or with a
    corrupt summary or log - is left out; `skipped` (if given) receives
    (run directory, reason) for each.
    """
    runs = []
    run_dirs = sorted({path.parent for name in ("summary.json", "train.csv", "train.csv.gz")
                       for path in Path(root).rglob(name) if ".hydra" not in path.parts})
    for run_dir in run_dirs:
        summary = read_summary(run_dir)
        reason = why_not_complete(summary)
        if reason is not None:  # a complete run is complete whatever lock file a killed trainer left behind
            pid = trainer_pid(run_dir)
            if pid is not None:  # its summary is the last segment's (interrupted, or none yet)
                reason = f"training now (pid {pid})"
        if reason is None:
            reason = incomplete_summary(summary)
        if reason is None:
            try:
                eval_log = numeric_log(run_dir / "eval.csv", ("env_steps", "eval_return_mean"))
                episodes = numeric_log(run_dir / "episodes.csv", ("env_steps", "episode_return"), rows_required=False)
                train = numeric_log(run_dir / "train.csv", ("env_steps", "rollout_time", "update_time"))
                finished = int(train["episodes"].sum()) if "episodes" in train.columns else 0
                if episodes.empty and finished:  # a log lost, not a run that finished no episode
                    raise ValueError(f"episodes.csv has no rows, yet train.csv counts {finished} finished episodes")
            except Exception as error:  # missing file, unparsable CSV, garbage rows
                reason = f"corrupt logs ({type(error).__name__}: {str(error).splitlines()[0][:160]})"
        if reason is not None:
            if skipped is not None:
                skipped.append((run_dir, reason))
            continue
        runs.append({
            "env": summary["env"], "algo": summary["algo"], "seed": summary["seed"],
            "env_steps": summary["env_steps"], "sps": summary["sps"], "dir": run_dir, "config": summary["config"],
            "eval": eval_log, "episodes": episodes, "trained_together": len(trained_together(summary)),
        })
    return runs


def left_out_lines(root: Path, skipped: list[tuple[Path, str]]) -> list[str]:
    """One line per (directory, reason) of the runs the table leaves out - running, interrupted, failed -, the
    seeds of a population in one line: `left out: Ant/ppo/seed0-9 (10 runs): interrupted by SIGTERM at ...`."""
    by_reason: dict[tuple[str, str], list[str]] = {}
    for run_dir, reason in skipped:
        where = run_dir.parent.relative_to(root).as_posix() + "/" if run_dir != Path(root) else ""
        by_reason.setdefault((where, reason), []).append(run_dir.name)
    return [f"left out: {where}{run_names(names)}: {reason}" for (where, reason), names in by_reason.items()]


def run_names(names: list[str]) -> str:
    """seed0..seed9 -> 'seed0-9 (10 runs)'; names that are not one run of consecutive seeds are listed."""
    numbers = [name[4:] for name in names if name.startswith("seed")]
    if len(names) > 1 and len(numbers) == len(names) and all(number.isdigit() for number in numbers):
        seeds = sorted(int(number) for number in numbers)
        if seeds == list(range(seeds[0], seeds[0] + len(seeds))):
            return f"seed{seeds[0]}-{seeds[-1]} ({len(seeds)} runs)"
        return ", ".join(f"seed{seed}" for seed in seeds)
    return ", ".join(sorted(names))
