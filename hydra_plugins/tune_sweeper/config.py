"""`hydra/sweeper=tune`: its keys, with their defaults (conf/tune/<family>.yaml sets them per family)."""

from dataclasses import dataclass, field
from typing import Any, Dict, List

from hydra.core.config_store import ConfigStore


@dataclass
class TuneSweeperConf:
    _target_: str = "hydra_plugins.tune_sweeper.sweeper.TuneSweeper"
    # Any Optuna storage URL; SQLite by default (one file per family, one study per preset).
    storage: str = "sqlite:///results/tuning/tuning.db"
    study_name: str = "${algo.name}"
    n_trials: int = 16            # finished trials (complete or failed) per study: every preset gets as many
    trials_per_batch: int = 1     # trials asked at once; their runs go to the launcher together
    sampler_seed: int = 0         # TPE's seed (offset by the number of finished trials at each ask)
    n_startup_trials: int = 8     # random trials before TPE models the objective
    tasks: List[str] = field(default_factory=lambda: ["CartPole"])  # env=... of each run of a trial
    seeds: List[int] = field(default_factory=lambda: [1000])         # tuning seeds (final evaluation uses others)
    enqueue_defaults: bool = True  # trial 0 = the preset's current values, so tuning never loses to them
    # Where `python -m benchmarks.tuning apply` writes the best values: a config of the `tuning`
    # group (conf/tuning/<name>.yaml, package env), used with +tuning=<name>.
    values_file: str = "???"
    # preset name -> {override key: {low, high, log} | {low, high, int: true} | {choices: [...]}}
    search_spaces: Dict[str, Any] = field(default_factory=dict)


ConfigStore.instance().store(group="hydra/sweeper", name="tune", node=TuneSweeperConf, provider="tune_sweeper")
