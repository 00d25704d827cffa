"""The tuning loop: ask Optuna for trials, launch their runs on Hydra's launcher, tell the objective.

    python run.py -m hydra/sweeper=tune +tune=mujoco algo=ppo hydra/launcher=joblib hydra.launcher.n_jobs=2

One trial is one set of hyperparameter values, trained once per tuning task x
tuning seed (its runs go to the configured launcher - basic, joblib or submitit -
in one batch with the other trials asked at the same time). Its objective is the
normalised area under the evaluation curve, averaged over those runs
(benchmarks/tuning.py). The study lives in the storage (SQLite by default), so a
killed tuning command rerun resumes: complete trials are kept, trials that were
running are relaunched with their values (their runs resume from checkpoints),
and the study asks for more until n_trials have finished.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)


class TuneSweeper(Sweeper):
    def __init__(self, storage: str, study_name: str, n_trials: int, trials_per_batch: int, sampler_seed: int,
                 n_startup_trials: int, tasks: list, seeds: list, enqueue_defaults: bool, values_file: str, search_spaces: Any,
                 population: bool = False, pruner: Any = None, env_step_budget: int | None = None):
        self.settings = dict(storage=storage, study_name=study_name, n_trials=n_trials,
                             trials_per_batch=trials_per_batch, sampler_seed=sampler_seed,
                             n_startup_trials=n_startup_trials, tasks=list(tasks), seeds=list(seeds),
                             enqueue_defaults=enqueue_defaults, population=population,
                             pruner=OmegaConf.to_container(pruner) if isinstance(pruner, DictConfig) else pruner,
                             env_step_budget=env_step_budget)
        self.search_spaces = OmegaConf.to_container(search_spaces, resolve=True) \
            if isinstance(search_spaces, DictConfig) else dict(search_spaces)
        self.config: DictConfig | None = None
        self.launcher = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> None:
        from benchmarks.tuning import TuningStudy, search_space_problems, space_searched, study_lock

        parsed = OverridesParser.create().parse_overrides(arguments)
        swept = [o.input_line for o in parsed if o.is_sweep_override()]
        if swept:
            raise SystemExit(f"config error: hydra/sweeper=tune tunes one preset; it takes no sweep overrides "
                             f"(got {', '.join(swept)}): run one tuning command per preset")
        preset, study_name = self.config.algo.name, self.settings["study_name"]
        space_name = space_searched(self.search_spaces, preset, study_name)
        if space_name is None:
            raise SystemExit(f"config error: no search space for algo={preset} in hydra.sweeper.search_spaces "
                             f"(have: {', '.join(sorted(self.search_spaces))}): add one in the round's "
                             f"conf/tune/<round>.yaml, or give it as an override, e.g. "
                             f"'+hydra.sweeper.search_spaces.{preset}={{algo.ent_coef:{{low:0.0,high:0.02}}}}' "
                             f"({{}}: nothing searched, the study trains the values so far once)")
        if not isinstance(self.search_spaces[space_name], dict):
            raise SystemExit(f"config error: hydra.sweeper.search_spaces.{space_name} must map keys to their ranges, "
                             f"e.g. {{algo.ent_coef:{{low:0.0,high:0.02}}}}, got {self.search_spaces[space_name]!r}")
        # A key set to null is not searched (a round that extends another drops a key of its space this way).
        space = {key: spec for key, spec in self.search_spaces[space_name].items() if spec is not None}
        problems = search_space_problems(f"hydra.sweeper.search_spaces.{space_name}", space, self.config)
        if problems:
            raise SystemExit("\n".join(f"config error: {problem}" for problem in problems))
        # one tuning command per study at a time (study_lock); the stale trials it resumes are read under it
        with study_lock(self.settings["storage"], study_name, Path(self.config.hydra.sweep.dir)):
            study = TuningStudy(config=self.config, search_space=space,
                                sweep_dir=Path(self.config.hydra.sweep.dir), **self.settings)
            job_index = 0
            while True:
                trials = batch = study.next_trials()
                if not trials:
                    break
                # Rung by rung (one rung, the whole budget, without a pruner): the trials still in train to the rung's
                # env steps, pausing there with a checkpoint; successive halving then stops the worst of them.
                for rung in study.rungs:
                    if not trials:
                        break  # every trial of the batch stopped at an earlier rung
                    jobs = [overrides for trial in trials for overrides in study.job_overrides(trial, arguments, rung)]
                    log.info("tuning %s: trial(s) %s to %d env steps (%d jobs; %s env steps spent so far)", preset,
                             ", ".join(str(t.number) for t in trials), rung, len(jobs), f"{study.spent_env_steps():,}")
                    self.launcher.launch(jobs, initial_job_idx=job_index)
                    job_index += len(jobs)
                    if rung == study.rungs[-1]:
                        for trial in trials:
                            study.finish(trial)
                    else:
                        trials = [trial for trial in trials if study.judge_at_rung(trial, rung)]
                study.refuse_untrained_batch(batch)
            study.log_summary()
