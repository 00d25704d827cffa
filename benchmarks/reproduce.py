"""Rerun stored runs from their own config and compare every logged number with the stored one.

    python -m benchmarks.reproduce results/runs/classic_10seeds/CartPole/ppo/seed0 [RUN_DIR ...]
    python -m benchmarks.reproduce RUN_DIR --set algo.backend=torch     # the same run on another backend
    python -m benchmarks.reproduce results/runs/classic_10seeds --one-per-preset   # a suite: its last seed per (task, preset)

For each run directory the config stored in its summary.json is trained again
(in a temporary directory, with the current code; a seed of a batch in its batch,
see Reruns), and train.csv, eval.csv and
episodes.csv are compared cell by cell, timing columns excepted (of a packed
run's episodes, the last 100 that its suite keeps). Prints, per
file, the number of rows and whether every number is identical; otherwise the
first differing row and column and the largest relative difference. Exit
status 1 if any run differs (so a performance change that must not change
numbers can be checked against committed results).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from unittest import mock

import numpy as np
from omegaconf import OmegaConf

from algorithms import algorithm_class
from benchmarks import numerics
from benchmarks.engine.batch_trainer import train_batch
from benchmarks.engine.config import RETIRED_BACKENDS, compose_config, with_later_keys
from benchmarks.engine.logger import TIMING_COLUMNS, read_csv_complete_rows
from benchmarks.engine.run_dir import machine, module_source
from benchmarks.engine.validate import ALGO_PRESETS
from benchmarks.engine.trainer import train
from benchmarks.arguments import existing_directory
from benchmarks.runs import group_runs, incomplete_summary, load_runs, read_summary, why_not_complete

COMPARED_LOGS = ("train.csv", "eval.csv", "episodes.csv")


def stored_episodes(run_dir: Path) -> int:
    """How many episodes the run finished, by its train.csv (its episodes.csv may hold only the last of them)."""
    train = read_csv_complete_rows(run_dir / "train.csv")
    return int(train["episodes"].sum()) if "episodes" in train.columns else 0


def compare_logs(stored_dir: Path, new_dir: Path) -> list[str]:
    """One line per log; lines of differing logs start with 'DIFF'."""
    lines = []
    for name in COMPARED_LOGS:
        stored, new = read_csv_complete_rows(stored_dir / name), read_csv_complete_rows(new_dir / name)
        kept = ""
        if name == "episodes.csv" and len(stored) < min(len(new), stored_episodes(stored_dir)):
            # a packed run keeps its last episodes; train.csv, compared above, holds every iteration's statistics
            kept = f" (the last {len(stored)} of the rerun's {len(new)}: all a packed suite keeps)"
            new = new.tail(len(stored)).reset_index(drop=True)
        columns = [c for c in stored.columns if c not in TIMING_COLUMNS]
        # a statistic logged since the run was made (a column only the rerun has) changes no stored number
        added = [c for c in new.columns if c not in stored.columns]
        if not set(stored.columns) <= set(new.columns) or len(new) != len(stored):
            lines.append(f"DIFF {name}: stored {len(stored)} rows x {list(stored.columns)}, "
                         f"rerun {len(new)} rows x {list(new.columns)}")
            continue
        a, b = stored[columns].to_numpy(float), new[columns].to_numpy(float)
        same = (a == b) | (np.isnan(a) & np.isnan(b))
        if same.all():
            lines.append(f"same {name}: {len(stored)} rows{kept}, every number identical"
                         + (f" (the rerun also logs {', '.join(added)}, added since)" if added else ""))
            continue
        row, col = np.argwhere(~same)[0]
        with np.errstate(divide="ignore", invalid="ignore"):
            relative = np.nanmax(np.abs(a - b) / np.maximum(np.abs(a), 1e-12))
        lines.append(f"DIFF {name}: {int((~same).sum())} of {same.size} numbers differ; first at row {row} "
                     f"column {columns[col]} ({a[row, col]!r} vs {b[row, col]!r}); largest relative difference "
                     f"{relative:.3g}")
    return lines


def stored_numerics_mode(run_dir: Path) -> str:
    """The kernel mode a run was made in; runs made before the mode existed used native kernels."""
    record = json.loads((run_dir / "summary.json").read_text()).get("machine") or {}
    return numerics.base_mode((record.get("numerics") or {}).get("mode", "native"))


def machine_note(run_dir: Path) -> str | None:
    """Why numbers may differ without a change in the code: the run was made on another CPU or kernel set."""
    stored = json.loads((run_dir / "summary.json").read_text()).get("machine")
    here = machine()
    if stored is None:
        return (f"the run predates machine records; this rerun is on {here['cpu']} ({here['torch_cpu_capability']} "
                f"kernels): on another instruction set float results differ in the last bits, then curves diverge")
    keys = ("cpu", "torch_cpu_capability", "numpy_simd", "numpy_blas")
    if all(stored.get(key) == here[key] for key in keys):
        return None
    return (f"stored on {stored.get('cpu')} ({stored.get('torch_cpu_capability')} kernels), rerun on {here['cpu']} "
            f"({here['torch_cpu_capability']} kernels): float results may differ across instruction sets")


def not_comparable_here(run_dir: Path) -> str | None:
    """One line when no rerun on this machine can confirm the run: made with native kernels (each library picks
    its CPU's widest), on another CPU. Bit-identity is promised across machines for portable-mode runs only."""
    summary = json.loads((run_dir / "summary.json").read_text())
    stored = summary.get("machine") or {}
    if numerics.base_mode(stored_numerics_mode(run_dir)) != "native" or stored.get("cpu") in (None, machine()["cpu"]):
        return None
    return (f"made with native kernels on {stored['cpu']}; this machine is {machine()['cpu']}: bit-identity is "
            f"promised only for portable-mode runs (SUITE_NUMERICS=portable, the default), so it is not rerun here")


def models_note(run_dir: Path, rerun_dir: Path) -> str | None:
    """Why numbers may differ: the run read other trained models than its rerun (a token task's reference or reward
    model built on another machine, in another numerics mode or by other code), told by the sha256 of their
    weights. None where they agree or the run predates the record."""
    stored = json.loads((run_dir / "summary.json").read_text()).get("task_models")
    if not stored:
        return None
    now = json.loads((rerun_dir / "summary.json").read_text()).get("task_models") or {}

    def named(model: dict | None) -> str:
        return f"{model.get('name')} (sha256 {str(model.get('sha256'))[:12]})" if model else "none"

    changed = [f"{what} {named(model)} then, {named(now.get(what))} now" for what, model in stored.items()
               if (now.get(what) or {}).get("sha256") != model.get("sha256")]
    if not changed:
        return None
    return (f"it read other trained models than its rerun: {'; '.join(changed)}; a difference below may be "
            f"these models' doing")


def source_note(run_dir: Path) -> str | None:
    """Why numbers may differ: the run's algorithm is a module:Class whose module's file has changed since."""
    stored = json.loads((run_dir / "summary.json").read_text()).get("algorithm_source")
    if not stored or not stored.get("sha256"):
        return None
    now = module_source(stored["module"])
    if now["sha256"] == stored["sha256"]:  # the same bytes, wherever the file now lies
        return None
    return (f"its algorithm's module {stored['module']} has changed since the run (sha256 {stored['sha256'][:12]} of "
            f"{stored['file']} then, {now['sha256'][:12] if now['sha256'] else 'none'} of {now['file']} now): a "
            f"difference below may be the code's")


def algorithm_not_importable(run_dir: Path) -> str | None:
    """One line when the run's algorithm, a module:Class of one's own, cannot be imported here: it is not rerun."""
    try:
        algorithm_class(json.loads((run_dir / "summary.json").read_text())["config"]["algo"]["algorithm"])
    except ValueError as error:
        return f"not rerun: {error} (its module must be importable, as where the run was made)"
    return None


def retired_backend(run_dir: Path, overrides: list[str]) -> str | None:
    """One line when the run was made on a retired backend (unless the overrides name another):
    its committed numbers stay as data, and nothing here can retrain them."""
    backend = (json.loads((run_dir / "summary.json").read_text()).get("config", {}).get("algo") or {}).get("backend")
    if backend not in RETIRED_BACKENDS or any(item.startswith("algo.backend=") for item in overrides):
        return None
    return (f"made with the retired algo.backend={backend} ({RETIRED_BACKENDS[backend]}): its numbers stay as "
            f"data and are not rerun (--set algo.backend=compiled retrains it on the compiled engine)")


def stored_config(run_dir: Path):
    """The run's stored config over today's defaults for its env and algo, so keys added since the run
    was made (e.g. algo.backend, logging.checkpoint_every_steps) take their default: the value the run used."""
    stored = with_later_keys(json.loads((run_dir / "summary.json").read_text())["config"])
    # a variant named by module:Class under a name of its own has no preset: PPO's defaults under its stored config
    preset = stored["algo"]["name"] if (ALGO_PRESETS / f"{stored['algo']['name']}.yaml").is_file() else "ppo"
    defaults = compose_config([f"env={stored['env']['name']}", f"algo={preset}"])
    OmegaConf.set_struct(defaults, False)  # a stored config may hold an experiment's extra keys (ci_budget)
    return OmegaConf.merge(defaults, stored)


class Reruns:
    """Each stored run trained again under `root`, from its own config with `overrides`. A seed of a batch
    (summary "batched", docs/scaling.md) is retrained in its batch: the seeds that trained together in
    one process, in their order, once for all of them (a seed's float rounding depends on the batch it
    shares arrays with)."""

    def __init__(self, root: Path, overrides: list[str]):
        self.root, self.overrides = root, overrides
        self.batches: dict[tuple, Path] = {}  # (job directory, seeds trained together) -> their reruns' root
        self.count = itertools.count()

    def config(self, run_dir: Path):
        config = stored_config(run_dir)
        config.merge_with_dotlist(self.overrides)
        config.logging.tensorboard = False
        config.logging.progress_bar = False
        return config

    def of(self, run_dir: Path) -> Path:
        """The directory of run_dir's rerun (training it, or its batch, on first use), its population program compiled
        or eager as the run's was (they round differently)."""
        summary = json.loads((run_dir / "summary.json").read_text())
        if not summary.get("batched"):  # no `batched` key: a run trained alone, before every run went through the population loop
            return self.trained(run_dir, summary)
        program = summary["batched"].get("program", "compiled")  # runs that predate the key were compiled
        with mock.patch.dict(os.environ, {"POPULATION_COMPILE": "0" if program == "eager" else "1"}):
            return self.trained(run_dir, summary)

    def trained(self, run_dir: Path, summary: dict) -> Path:
        config = self.config(run_dir)
        batched = summary.get("batched")
        if batched and config.get("seeds") is None and len(batched.get("trained_together") or batched["seeds"]) == 1:
            batched = None  # a population of one: train() trains it so
        if batched and config.get("seeds") is None:
            print(f"note: {run_dir} was trained in a batch; the overrides {self.overrides} retrain it alone",
                  flush=True)
            batched = None
        if not batched:
            rerun = self.root / f"run{next(self.count)}"
            train(config, rerun)
            return rerun
        together = batched.get("trained_together") or batched["seeds"]
        key = (run_dir.resolve().parent, tuple(together))
        if key not in self.batches:
            batch_root = self.root / f"batch{next(self.count)}"
            train_batch(config, [batch_root / f"seed{seed}" for seed in together], together)
            self.batches[key] = batch_root
        return self.batches[key] / f"seed{summary['seed']}"


def runs_to_check(paths: list[Path], one_per_preset: bool) -> list[Path]:
    """The run directories named, and the complete runs below each suite directory named (every one, or
    with one_per_preset the highest seed of each (suite, task, preset): the one a batch rounds last)."""
    run_dirs = []
    for path in paths:
        if (path / "summary.json").is_file():
            summary = read_summary(path)
            reason = why_not_complete(summary) or incomplete_summary(summary)
            if reason is not None:
                raise ValueError(f"{path}: {reason}: only a complete run is reproduced")
            run_dirs.append(path)
            continue
        runs = load_runs(path)
        if not runs:
            raise ValueError(f"{path} is not a run directory (no summary.json) nor a suite holding complete runs")
        groups = group_runs(runs).values()
        run_dirs += [group[-1]["dir"] for group in groups] if one_per_preset else [r["dir"] for g in groups for r in g]
    return run_dirs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", type=existing_directory,
                        help="run directories, or suite directories: every complete run below one")
    parser.add_argument("--one-per-preset", action="store_true",
                        help="of a suite directory, only the highest seed of each (task, preset)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="config overrides for the rerun (dotted keys), e.g. algo.backend=torch")
    parser.add_argument("--tally", type=Path, help=argparse.SUPPRESS)  # a child's counts: differing, retired
    args = parser.parse_args(argv)
    retired = [item for item in args.set if item.partition("=")[::2] in
               {("algo.backend", name) for name in RETIRED_BACKENDS}]
    if retired:
        parser.error(f"argument --set: {retired[0]} is a retired backend ({RETIRED_BACKENDS[retired[0].split('=')[1]]}); "
                     f"use algo.backend=compiled or torch")
    try:
        args.run_dirs = runs_to_check(args.run_dirs, args.one_per_preset)
    except ValueError as error:
        parser.error(f"argument run_dirs: {error}")
    # A run is rerun in the kernel mode it was made in: runs of the other mode go to a child process
    # started with that mode (the mode is fixed when numpy and torch load, so this process cannot switch).
    here = numerics.base_mode(numerics.MODE)
    other_mode = [d for d in args.run_dirs if stored_numerics_mode(d) != here]
    differing = retired = unconfirmed = 0  # unconfirmed: not rerun here (counted in differing as well)
    if other_mode:
        mode = "native" if here == "portable" else "portable"
        print(f"{len(other_mode)} run(s) were made with {mode} kernels: rerunning them in a child process "
              f"with {numerics.MODE_VARIABLE}={mode}", flush=True)
        set_arguments = ["--set", *args.set] if args.set else []
        with tempfile.TemporaryDirectory() as tmp:
            tally = Path(tmp) / "differing"
            child = subprocess.run([sys.executable, "-m", "benchmarks.reproduce", *map(str, other_mode),
                                    *set_arguments, "--tally", str(tally)], env=numerics.environment_for(mode))
            # a child that died before its tally counts all its runs as not reproduced
            child_counts = tally.read_text().split() if child.returncode in (0, 1) and tally.exists() else None
            differing += int(child_counts[0]) if child_counts else len(other_mode)
            retired += int(child_counts[1]) if child_counts else 0
            unconfirmed += int(child_counts[2]) if child_counts else len(other_mode)
    with tempfile.TemporaryDirectory() as tmp:
        reruns = Reruns(Path(tmp), list(args.set))
        for run_dir in [d for d in args.run_dirs if d not in other_mode]:
            data_only = retired_backend(run_dir, args.set)
            if data_only:
                print(f"{run_dir}: {data_only}")
                retired += 1
                continue
            elsewhere = not_comparable_here(run_dir) or algorithm_not_importable(run_dir)
            if elsewhere:
                print(f"{run_dir}: {elsewhere}")
                differing += 1  # not confirmed: it does not count as reproduced
                unconfirmed += 1
                continue
            rerun = reruns.of(run_dir)
            lines = compare_logs(run_dir, rerun)
            differing += any(line.startswith("DIFF") for line in lines)
            print(f"{run_dir}:")
            for note in (machine_note(run_dir), source_note(run_dir), models_note(run_dir, rerun)):
                if note:
                    print(f"  note: {note}")
            for line in lines:
                print(f"  {line}")
    if args.tally:
        args.tally.write_text(f"{differing} {retired} {unconfirmed}")
        sys.exit(1 if differing else 0)
    rerun = len(args.run_dirs) - retired
    notes = ([f"{unconfirmed} could not be rerun here, said above"] if unconfirmed else []) + (
        [f"{retired} made with a retired backend: data, not rerun"] if retired else [])
    print(f"{rerun - differing} of {rerun} runs reproduce every logged number"
          + (f" ({'; '.join(notes)})" if notes else ""))
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    main()
