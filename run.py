"""Hydra entry point: compose -> validate -> train.

    python run.py algo=outer_ppo env=HalfCheetah seed=1
    python run.py -m algo=ppo,hp3o env=CartPole seed=0,1,2
"""

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, ListConfig, OmegaConf

from benchmarks.engine.logger import DiskFullError
from benchmarks.engine.validate import ConfigError, validate_config

log = logging.getLogger(__name__)


def refuse_seed_beside_seeds(cfg: DictConfig, overrides) -> None:
    """`seeds=[...]` trains its seeds as one population and reads no `seed`: a `seed=` typed beside it would be
    ignored without a word, so the command is refused instead."""
    given = {override.split("=", 1)[0].lstrip("+~") for override in overrides}
    if cfg.seeds is not None and "seed" in given:
        seeds = ",".join(str(seed) for seed in cfg.seeds)
        raise ConfigError(f"seed={cfg.seed} and seeds=[{seeds}] are both given (one of them may be the experiment's "
                          f"sweep): seeds=[...] trains its seeds as one population and ignores seed; give one of them "
                          f"(seeds=[{cfg.seed}] trains seed {cfg.seed} alone)")


def note_task_override(cfg: DictConfig) -> None:
    """env.id or env.name typed over the chosen env=<Name> trains another task, or the same under another name, with
    <Name>'s family values and scores: said once, so that such a run is not taken for what its name says."""
    chosen = HydraConfig.get().runtime.choices.get("env")
    preset = Path(__file__).parent / "conf" / "env" / f"{chosen}.yaml"
    if not preset.is_file():
        return
    own = OmegaConf.load(preset)
    if (own.get("id"), own.get("name")) != (cfg.env.id, cfg.env.name):
        print(f"note: env.id={cfg.env.id} env.name={cfg.env.name} over env={chosen} (id {own.get('id')}): the run "
              f"trains {cfg.env.id} under the name {cfg.env.name} (its run directory and report rows) with "
              f"env={chosen}'s family values and scores; a task of its own is a conf/env/<Name>.yaml file "
              f"(docs/extending.md)", file=sys.stderr)


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    mark_job(cfg, Path(HydraConfig.get().runtime.output_dir))
    try:
        validate_config(cfg)
        refuse_seed_beside_seeds(cfg, HydraConfig.get().overrides.task)
    except ConfigError as error:
        return refuse(error)

    note_task_override(cfg)

    if cfg.seeds is not None:
        return main_batch(cfg, Path(HydraConfig.get().runtime.output_dir))
    from benchmarks.engine.trainer import train  # heavy imports only after the config is known good

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    if cfg.restart:
        start_afresh(run_dir)
    try:
        finished = completed_summary(cfg, run_dir)
    except ConfigError as error:
        return refuse(error)
    if finished is not None:
        # Rerunning a sweep fills in only what is missing: a finished run is never trained twice.
        say_skipped(run_dir, finished)
        return finished["final_eval_return_mean"]
    from benchmarks.engine.batch_trainer import stopped_on_non_finite

    if (stopped := stopped_on_non_finite(run_dir, cfg)) is not None:  # as seeds=[k] finds it (a population of one)
        say_stopped(run_dir, stopped)
        return leave_failed()
    summaries = train_job(cfg, run_dir, [run_dir], lambda: [train(cfg, run_dir, announce=lambda: log.info(
        "training %s on %s, seed %d, %d env steps -> %s", cfg.algo.name, cfg.env.name, cfg.seed, cfg.total_steps,
        run_dir))])
    if summaries is None:
        return None
    summary = summaries[0]
    if summary["status"] == "paused":
        log.info("paused at %d env steps (pause_at_steps=%d): rerun without it to continue", summary["env_steps"],
                 cfg.pause_at_steps)
        return None
    log.info("done in %.0f s (%.0f SPS); final eval return %.2f +- %.2f", summary["wall_time_s"], summary["sps"],
             summary["final_eval_return_mean"], summary["final_eval_return_std"])
    return summary["final_eval_return_mean"]


def refuse(error: ConfigError) -> None:
    """A config refused, in one line per line of the error. A single run exits 2; one bad job of a sweep is
    recorded as failed (in its job mark, and in a summary of each of its runs - a batch job's are its seeds'
    directories - where there is none or an earlier refusal's: never over an earlier run's), the others go on,
    and the sweep's end lists it and exits non-zero (benchmarks/engine/hydra_callbacks.py)."""
    for line in str(error).splitlines():
        print(f"config error: {line}", file=sys.stderr)
    job_dir = Path(HydraConfig.get().runtime.output_dir)
    if HydraConfig.get().mode != RunMode.MULTIRUN:
        remove_if_untouched(job_dir)
        sys.exit(2)
    from benchmarks.engine.hydra_callbacks import job_run_dirs, refuse_job
    from benchmarks.engine.logger import write_json_atomic
    from benchmarks.runs import read_summary

    reason = "config error: " + "; ".join(str(error).splitlines())
    refuse_job(job_dir, reason)
    for run_dir in job_run_dirs(job_dir):
        earlier = read_summary(run_dir)
        if earlier["status"] == "partial" or earlier.get("error", "").startswith("config error: "):
            run_dir.mkdir(parents=True, exist_ok=True)
            write_json_atomic(run_dir / "summary.json", {"status": "failed", "error": reason})


def say_before_training(cfg: DictConfig) -> None:
    """Notes on the console before the compute is spent: a budget that is not whole iterations, and a measured
    result of the preset on the task's family (env.tuned.<preset>.known_result)."""
    rollout = cfg.env.num_envs * cfg.env.num_steps
    trained_steps = cfg.total_steps // rollout * rollout
    if trained_steps != cfg.total_steps:  # the budget is whole iterations
        print(f"note: total_steps={cfg.total_steps} trains {trained_steps} env steps ({trained_steps // rollout} "
              f"iteration(s) of {cfg.env.num_envs} envs x {cfg.env.num_steps} steps)", file=sys.stderr)
    known_result = OmegaConf.select(cfg, f"env.tuned.{cfg.algo.name}.known_result", default=None)
    if known_result:
        print(f"note: {cfg.algo.name} on the {cfg.env.family} family: {known_result}", file=sys.stderr)


def train_job(cfg: DictConfig, job_dir: Path, run_dirs: list[Path], training) -> list[dict] | None:
    """training() - a single run's or a batch's, into run_dirs - with the one set of answers to how it ends, and
    its summaries. None: it failed in a sweep (recorded in each run's summary.json and logged; the other jobs go
    on, and the sweep's end lists every failure and exits non-zero, benchmarks/engine/hydra_callbacks.py).
    Otherwise a failure ends the process: in one line where the error says what happened and where, with its
    traceback where it is a fault of the code."""
    import gymnasium

    from algorithms.population import LossReadError
    from benchmarks.engine.checkpoint import CheckpointError, CheckpointOfAnotherConfig
    from benchmarks.engine.run_dir import RunLockedError
    from benchmarks.engine.trainer import NonFiniteError, TrainingInterrupted

    where = run_dirs[0] if run_dirs == [job_dir] else run_dirs[0].parent  # a batch's: where its seeds' are
    say_before_training(cfg)
    hydra_records = write_hydra_files(cfg, job_dir)
    try:
        return training()
    except TrainingInterrupted as interrupt:
        # Preemption stops the whole sweep, not just this job; rerunning the command resumes.
        print(f"interrupted: {where}: {interrupt}", file=sys.stderr)
        sys.exit(128 + interrupt.signum)
    except RunLockedError as error:  # the other process's run: nothing of it is touched
        leave_the_other_run(job_dir, hydra_records)
        print(f"error: {error}{in_a_sweep(error)}", file=sys.stderr)
        sys.exit(1)
    except Exception as caught:
        error = disk_full(caught) or caught
        if isinstance(error, CheckpointOfAnotherConfig):
            leave_the_other_run(job_dir, hydra_records)
        for run_dir in run_dirs:  # unless the trainer recorded its own
            record_failure(run_dir, error)
        # bad input or a run's own end (a task id Gymnasium does not know, env.id=Foo-v0, among them)
        expected = isinstance(error, (NonFiniteError, CheckpointError, DiskFullError, LossReadError,
                                      gymnasium.error.Error))
        if HydraConfig.get().mode != RunMode.MULTIRUN:
            if expected:  # one line, no traceback: the message says what happened and where
                print(f"error: {where}: {error}", file=sys.stderr)
                sys.exit(1)
            raise
        if expected:
            log.error("job failed: %s: %s%s", where, error, in_a_sweep(error))
        else:
            log.exception("job failed: %s", where)
        return None


def disk_full(error: BaseException) -> DiskFullError | None:
    """A full disk (or quota), wherever it struck (a checkpoint, a log line), as one DiskFullError; else None."""
    import errno

    if isinstance(error, DiskFullError):
        return error
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFullError(f"no space left on the device ({error.filename or 'a log or checkpoint'}): a resume "
                             f"starts from the last whole checkpoint; free space and rerun the same command")
    return None


def main_batch(cfg: DictConfig, job_dir: Path) -> float | None:
    """seeds=[...]: the seeds not yet complete, trained in lockstep in this process (benchmarks/engine/batch_trainer.py)."""
    from benchmarks.engine.batch_trainer import seed_config, seed_run_dirs, stopped_on_non_finite, train_batch

    seeds, run_dirs = list(cfg.seeds), seed_run_dirs(job_dir, list(cfg.seeds))
    finals = {}
    for seed, run_dir in zip(seeds, run_dirs):
        if cfg.restart:
            start_afresh(run_dir)
        try:
            finished = completed_summary(seed_config(cfg, seed), run_dir)
        except ConfigError as error:
            return refuse(error)
        if finished is not None:
            say_skipped(run_dir, finished)
            finals[seed] = finished["final_eval_return_mean"]
    todo = [(seed, run_dir) for seed, run_dir in zip(seeds, run_dirs) if seed not in finals]
    stopped = [(run_dir, error) for seed, run_dir in todo
               if (error := stopped_on_non_finite(run_dir, seed_config(cfg, seed))) is not None]
    if todo and len(stopped) == len(todo):  # each stopped alone on non-finite numbers; a rerun would stop it again
        for run_dir, error in stopped:
            say_stopped(run_dir, error)
        if not finals:  # as the run that stopped them ended: failed
            return leave_failed()
        todo = []
    if todo:
        todo_seeds, todo_dirs = [seed for seed, _ in todo], [run_dir for _, run_dir in todo]
        summaries = train_job(cfg, job_dir, todo_dirs, lambda: train_batch(cfg, todo_dirs, todo_seeds, announce=lambda:
                              log.info("training %s on %s, seeds %s in one batch, %d env steps each -> %s",
                                       cfg.algo.name, cfg.env.name, todo_seeds, cfg.total_steps, todo_dirs[0].parent)))
        if summaries is None:  # failed in a sweep (recorded): the job returns no score, as a single run's
            return None
        for summary in summaries:
            if summary["status"] == "paused":
                log.info("seed %d paused at %d env steps (pause_at_steps=%d)", summary["seed"], summary["env_steps"],
                         cfg.pause_at_steps)
                continue
            finals[summary["seed"]] = summary["final_eval_return_mean"]
            log.info("seed %d done in %.0f s; final eval return %.2f", summary["seed"], summary["wall_time_s"],
                     summary["final_eval_return_mean"])
    return sum(finals.values()) / len(finals) if finals else None


def remove_if_untouched(job_dir: Path) -> None:
    """A refused config leaves no run directory behind: the one Hydra made for it holds nothing but its log and
    the job mark, and goes (a directory holding anything else - an earlier run - is left as it is). In the default
    layout, runs/ of the working directory, so do the directories above it that are then empty (Hydra makes the
    whole path: runs/CartPole/ppo/algo.lr=-1/ of a refused `algo.lr=-1`); elsewhere (hydra.run.dir=...) only the
    run directory goes."""
    from benchmarks.engine.hydra_callbacks import JOB_MARK

    if HydraConfig.get().mode == RunMode.MULTIRUN or not job_dir.is_dir():
        return  # a sweep's end reads its jobs' directories
    runs_root = Path(HydraConfig.get().runtime.cwd).resolve() / "runs"  # conf/config.yaml's hydra.run.dir
    if {path.name for path in job_dir.iterdir()} <= {"run.log", JOB_MARK}:
        above = job_dir.resolve().parent
        for path in job_dir.iterdir():
            path.unlink()
        job_dir.rmdir()
        try:
            while (above == runs_root or runs_root in above.parents) and not any(above.iterdir()):
                above.rmdir()
                above = above.parent
        except OSError:  # another process made or removed a directory on the way: it is theirs
            pass


def mark_job(cfg: DictConfig, job_dir: Path) -> None:
    """Note in the job's directory that this sweep ran it, and which seeds it holds (a batch job's runs
    are its seeds' directories), before anything can refuse or skip it."""
    import os

    from benchmarks.engine.hydra_callbacks import SWEEP_ID, write_job_mark  # how the sweep's end finds its jobs

    job_dir.mkdir(parents=True, exist_ok=True)
    seeds = OmegaConf.select(cfg, "seeds", default=None)
    if not isinstance(seeds, ListConfig):
        seeds = None  # one seed, or a value the validator refuses next (seeds=abc), in one line
    write_job_mark(job_dir, {"seeds": OmegaConf.to_container(seeds) if seeds is not None else None,
                             "sweep": os.environ.get(SWEEP_ID)})


HYDRA_RECORD = ("config.yaml", "hydra.yaml", "overrides.yaml")


def write_hydra_files(cfg: DictConfig, job_dir: Path) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """Hydra's .hydra/ record of the job (config.yaml, hydra.yaml, overrides.yaml), written only by a job that
    trains: a skipped or refused job leaves an earlier run's record as it was (hydra.output_subdir is null).
    Returns the record it replaced and the one it wrote, for a job that the training then refuses to put back
    (leave_the_other_run)."""
    hydra_cfg = HydraConfig.get()
    record = job_dir / ".hydra"
    record.mkdir(parents=True, exist_ok=True)
    previous = {name: (record / name).read_bytes() for name in HYDRA_RECORD if (record / name).exists()}
    OmegaConf.save(cfg, record / "config.yaml")
    OmegaConf.save(OmegaConf.create({"hydra": hydra_cfg}), record / "hydra.yaml")
    OmegaConf.save(hydra_cfg.overrides.task, record / "overrides.yaml")
    return previous, {name: (record / name).read_bytes() for name in HYDRA_RECORD}


def leave_the_other_run(job_dir: Path, records: tuple[dict[str, bytes], dict[str, bytes]]) -> None:
    """A job refused once training starts - the directory in use by another process, or holding another config's
    checkpoint (another point of the same sweep) - leaves that run's log and record as they were. Its run.log:
    Hydra's file handler for it is closed, so that what this job says next goes to the console only (the
    "training ..." line waits for the trainer's announce). Its .hydra/ record: each file this job wrote goes back
    to what it replaced (a file another job wrote since stays). (A checkpoint's refusal is still recorded in the
    directory's summary.json, which a sweep's end and a study read; the checkpoint resumes as before.)"""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).resolve().parent == job_dir.resolve():
            root.removeHandler(handler)
            handler.close()
    previous, written = records
    record = job_dir / ".hydra"
    for name in HYDRA_RECORD:
        path = record / name
        if not path.exists() or path.read_bytes() != written[name]:
            continue
        if name in previous:
            path.write_bytes(previous[name])
        else:
            path.unlink()
    if record.is_dir() and not any(record.iterdir()):
        record.rmdir()


def say_stopped(run_dir: Path, error: str) -> None:
    """A run (or a population's seed) that stopped on non-finite numbers: its result, which a rerun would only
    reach again (the resume is exact), so it is not trained."""
    print(f"stopped, skipped: {run_dir} ({error}; restart=true trains it again)", file=sys.stderr)


def leave_failed() -> None:
    """A job whose runs all stopped: failed, as the run that stopped them ended (exit 1; in a sweep the sweep's end
    lists each failed run from its summary.json and exits non-zero)."""
    if HydraConfig.get().mode == RunMode.MULTIRUN:
        return None
    sys.exit(1)


def say_skipped(run_dir: Path, finished: dict) -> None:
    """On the console only: the complete run's own run.log stays as it was written."""
    print(f"already complete, skipped: {run_dir} (final eval return {finished['final_eval_return_mean']:.2f})",
          file=sys.stderr)


# A sweep's run directory that also names the job's overrides, as a single run's does (conf/config.yaml's
# hydra.run.dir): what a sweep over algo.lr or any key besides env, algo and seed needs (docs/configuration.md).
SWEEP_SUBDIR_BY_OVERRIDES = "${env.name}/${algo.name}/${overrides_dir:${hydra:job.override_dirname}}/${seed_dir:${seed},${seeds}}"


def sweep_points_hint() -> str:
    """What a refusal over a run directory another config holds adds in a sweep: the override that separates its
    points (a sweep over algo.lr trains each value in <env>/<algo>/seed<k> otherwise)."""
    return (f"if the points of this sweep differ in a key besides env, algo and seed, add "
            f"'hydra.sweep.subdir=\"{SWEEP_SUBDIR_BY_OVERRIDES}\"' to give each point its own directory")


def in_a_sweep(error: Exception) -> str:
    """The hint, after a job's refusal by a run directory held by another process or by another config's checkpoint."""
    from benchmarks.engine.checkpoint import CheckpointOfAnotherConfig
    from benchmarks.engine.run_dir import RunLockedError

    # (a checkpoint of the same run in another population of seeds: that population is the remedy, said already)
    held = isinstance(error, RunLockedError) or isinstance(error, CheckpointOfAnotherConfig) and error.keys != ["seeds"]
    return f"; {sweep_points_hint()}" if held and HydraConfig.get().mode == RunMode.MULTIRUN else ""


# What a run writes into its directory (besides Hydra's .hydra/ and run.log, written before the task starts).
RUN_FILES = ("summary.json", "train.csv", "train.csv.gz", "eval.csv", "episodes.csv", "episodes.csv.gz",
             "checkpoint.pt", "checkpoint.prev.pt", "checkpoint.pt.damaged")


def start_afresh(run_dir: Path) -> None:
    """restart=true: delete what an earlier run of this config left in run_dir (logs, checkpoints, summary,
    TensorBoard events), so that this command trains from the first step. A run directory in use by another
    process is left alone (the training then refuses it with one line)."""
    import shutil

    from benchmarks.engine.run_dir import RunLockedError, run_lock

    if not run_dir.is_dir():
        return
    try:
        with run_lock(run_dir):
            removed = [name for name in RUN_FILES if (run_dir / name).exists()]
            for name in removed:
                (run_dir / name).unlink()
            if (run_dir / "tb").is_dir():
                shutil.rmtree(run_dir / "tb")
                removed.append("tb/")
    except RunLockedError:
        return
    if removed:
        print(f"restart=true: removed {', '.join(removed)} from {run_dir}", file=sys.stderr)


def record_failure(run_dir: Path, error: BaseException) -> None:
    """summary.json says the run failed and why, unless the trainer recorded its failure already."""
    from benchmarks.engine.logger import write_json_atomic

    if not is_recorded_failure(run_dir):
        try:  # a few bytes may still fit on a full disk; if not, the checkpoint still resumes the run
            write_json_atomic(run_dir / "summary.json",
                              {"status": "failed", "error": f"{type(error).__name__}: {error}"})
        except DiskFullError:
            pass


def is_recorded_failure(run_dir: Path) -> bool:
    from benchmarks.runs import read_summary

    return read_summary(run_dir)["status"] == "failed"


def completed_summary(cfg: DictConfig, run_dir: Path) -> dict | None:
    """The summary of a complete run of this same config in run_dir, or None; a different config there is a
    ConfigError."""
    from benchmarks.engine.config import RETIRED_BACKENDS, differing_keys, numbers_relevant
    from benchmarks.runs import read_summary

    summary = read_summary(run_dir)
    if summary["status"] != "complete":
        return None
    stored = numbers_relevant(summary["config"])
    current = numbers_relevant(OmegaConf.to_container(cfg, resolve=True))
    if stored["algo"].get("backend") in RETIRED_BACKENDS:
        # a committed run of a retired backend stays as data: the same config on today's engine counts as it
        # (restart=true retrains it there)
        stored["algo"] = {**stored["algo"], "backend": current["algo"].get("backend")}
    keys = differing_keys(stored, current)
    if keys == ["seeds"]:  # the same seed, trained alone and in a population (or in two populations)
        others = [seed for seed in current["seeds"] or [] if seed != cfg.seed]
        if stored["seeds"] is not None:
            remedy = f"rerun seeds={stored_seeds(stored)} (it skips the complete seeds)"
        else:
            remedy = (f"train the others without it (seeds=[{','.join(map(str, others))}])" if others else
                      f"seed={cfg.seed} finds it complete")
        remedy += f", or add restart=true to train it again {trained_as(current)}"
        raise ConfigError(f"{run_dir} holds a complete run of seed {cfg.seed} trained {trained_as(stored)}, and "
                          f"this command trains it {trained_as(current)}: the two round differently; {remedy}")
    if stored != current:
        # a sweep's runs go to <env>/<algo>/seed<k> (a suite's layout): points of a sweep over other keys share it
        remedy = (f"choose another hydra.sweep.dir or delete it; {sweep_points_hint()}"
                  if HydraConfig.get().mode == RunMode.MULTIRUN else "choose another hydra.run.dir or delete it")
        raise ConfigError(f"{run_dir} holds a complete run with a different config (differs in: "
                          f"{', '.join(keys)}); {remedy}")
    return summary


def stored_seeds(config: dict) -> str:
    return f"[{','.join(map(str, config['seeds']))}]"


def trained_as(config: dict) -> str:
    """How a config trains its seed: alone, or in a population (seeds=[...])."""
    return "alone" if config["seeds"] is None else f"in a population of seeds={stored_seeds(config)}"


def refuse_an_unusable_run_directory(arguments: list[str]) -> None:
    """hydra.run.dir / hydra.sweep.dir naming an existing file, or a path inside a file or an unwritable directory:
    one line, before Hydra fails making it a directory (nothing is made here)."""
    import os

    for argument in arguments:
        key, _, value = argument.partition("=")
        key = key.lstrip("+")
        if key not in ("hydra.run.dir", "hydra.sweep.dir") or not value:
            continue
        path = Path(value)
        if path.is_file():
            problem = "is a file, not a directory: give a directory"
        else:
            existing = next(parent for parent in [path, *path.absolute().parents] if parent.exists())
            if not existing.is_dir():
                problem = f"cannot be made: {existing} is a file"
            elif not os.access(existing, os.W_OK | os.X_OK):
                problem = f"cannot be made: {existing} is not writable"
            else:
                continue
        print(f"config error: {key}={value} {problem}", file=sys.stderr)
        sys.exit(2)


def refuse_an_unknown_name(arguments: list[str]) -> None:
    """A config group given an option it does not have, or a key typed that the config does not have: one line
    each (refuse_an_unknown_choice, refuse_an_unknown_key), before Hydra's many lines. A search path or primary
    config of one's own is left to Hydra, and so is a syntax error (Hydra says where)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = [argument for argument in arguments if "=" in argument and not argument.startswith("-")]
    if any(argument.startswith(("-cp", "-cd", "-cn", "--config-path", "--config-dir", "--config-name"))
           for argument in arguments) or any(
            override.lstrip("+~").startswith("hydra.searchpath") for override in overrides):
        return
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:  # a syntax error: Hydra says where
        return
    with initialize_config_dir(config_dir=str(Path(__file__).parent / "conf"), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        refuse_an_unknown_choice(parsed, loader)
        refuse_an_unknown_key(parsed, loader)


def refuse_an_unknown_choice(parsed: list, loader) -> None:
    """env=cartpole, algo=outer-ppo, hydra/launcher=jobib, one value of a sweep's list: the nearest option and the
    list. The options are Hydra's own (conf/<group>/*.yaml and the plugins')."""
    import difflib

    from hydra.core.override_parser.types import ChoiceSweep

    for override in parsed:
        options = loader.get_group_options(override.key_or_group) if not override.is_delete() else []
        if not options:
            continue  # a key, not a config group
        if override.is_sweep_override():
            if not isinstance(override.value(), ChoiceSweep):
                continue  # glob(...), range(...): Hydra expands them
            values = list(override.value().list)
        else:
            values = [override.value()]
        for value in values:
            # a/b: a nested option; ${...}: an interpolation Hydra resolves after choosing; Name.yaml: Name
            if (not isinstance(value, str) or "/" in value or "${" in value or value in options
                    or value.removesuffix(".yaml") in options):
                continue
            near = difflib.get_close_matches(value.lower(), [option.lower() for option in options], n=1)
            hint = next((f" (did you mean {option}?)" for option in options if near and option.lower() == near[0]), "")
            print(f"config error: {override.input_line}: {override.key_or_group} has no option {value or repr(value)}"
                  f"{hint}; its options: {', '.join(options)}", file=sys.stderr)
            sys.exit(2)


def refuse_an_unknown_key(parsed: list, loader) -> None:
    """algo.lrr=0.001 (no key lrr in algo; Hydra adds a key only when it is typed +algo.lrr=...): the nearest key
    and the keys there. The command's config is composed once for it, a sweep's list standing for its first value.
    Left to Hydra: a sweep of a config group that is no list (glob(...), range(...)), an experiment or sweeper that
    chooses values itself (hydra.sweeper.params: the rlhf experiments choose env there), Hydra's own keys, and
    whatever else Hydra reports."""
    import difflib

    from hydra import compose
    from hydra.core.override_parser.types import ChoiceSweep
    from hydra.errors import ConfigCompositionException

    def typed(override) -> str | None:  # the override as one value, or None where it cannot stand for the sweep
        if not override.is_sweep_override():
            return override.input_line
        if isinstance(override.value(), ChoiceSweep) and override.value().list:
            return f"{override.get_key_element()}={override.value().list[0]}"
        return None

    plain = {override.input_line: typed(override) for override in parsed}
    if any(plain[override.input_line] is None and loader.get_group_options(override.key_or_group)
           for override in parsed):
        return  # glob(...) or range(...) over a group: which option a job gets is Hydra's to expand
    try:
        compose("config", overrides=[line for line in plain.values() if line is not None])
        return
    except ConfigCompositionException as error:
        message = str(error)
    except Exception:  # anything else: Hydra says it, as it would have
        return
    if not message.startswith("Could not override '") or message.split("'")[1].startswith("hydra."):
        return  # Hydra's own keys (a launcher's, a sweeper's): Hydra names them
    key = message.split("'")[1]
    typed_line = next((line for line, one in plain.items() if one and one.split("=", 1)[0] == key), key)
    try:
        config = compose("config", overrides=[one for one in plain.values() if one and one.split("=", 1)[0] != key],
                         return_hydra_config=True)
    except Exception:
        return
    sweeper = config.hydra.sweeper
    if sweeper.get("params") or not str(sweeper.get("_target_", "")).endswith("BasicSweeper"):
        return  # the sweep sets values of its own before the command line's
    parent, name = key.rsplit(".", 1) if "." in key else ("", key)
    while parent and OmegaConf.select(config, parent, default=MISSING_NODE) is MISSING_NODE:  # env.foo.bar: no foo
        parent, name = parent.rsplit(".", 1) if "." in parent else ("", parent)
    node = OmegaConf.select(config, parent) if parent else config
    if not isinstance(node, DictConfig):
        return  # algo.target_kl.x=1: a value, not a group of keys; Hydra says so
    keys = sorted(str(k) for k in node.keys() if k != "hydra")
    near = difflib.get_close_matches(name, keys, n=1)
    own = f" (a key of an algorithm class of one's own is added with +{key}=...)" if parent == "algo" else ""
    print(f"config error: {typed_line}: {parent or 'the config'} has no key {name}"
          f"{f' (did you mean {near[0]}?)' if near else ''}; its keys: {', '.join(keys)}{own}", file=sys.stderr)
    sys.exit(2)


MISSING_NODE = object()  # OmegaConf.select's default where a key is absent (None is a value a key may hold)


if __name__ == "__main__":
    refuse_an_unusable_run_directory(sys.argv[1:])
    refuse_an_unknown_name(sys.argv[1:])
    main()
