"""A run's configuration: composed as `python run.py` composes it, and the one place that fills the keys a
stored run predates (with_later_keys), so that stored runs compare, resume and reproduce under today's schema."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf


PROJECT_ROOT = Path(__file__).resolve().parents[2]
MAX_SEED = 2**32 - 1  # numpy's and Gymnasium's seed range


def compose_config(overrides: list[str], hydra_settings: bool = False) -> DictConfig:
    """conf/config.yaml with these overrides, composed as `python run.py` composes it (for tools and tests);
    hydra_settings: with Hydra's own settings (`hydra.sweep.dir`, the sweeper's params) under `hydra`."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import benchmarks.engine.validate  # noqa: F401  (registers the resolvers conf/ uses: seed_dir, fastest_backend)

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=hydra_settings)


def with_later_keys(config: dict) -> dict:
    """A stored run's config (summary.json, checkpoint) with every key it predates set to the value it ran
    with, as the schema declares it (`Before(...)` in a key's annotation in the Config dataclasses), so that a stored
    run compares key by key with a config composed today (skip and resume) and retrains as it ran (reproduce).
    The algo keys any registered algorithm's schema declares are filled for every run, whatever its algorithm (both
    sides of a comparison get them alike); a module:Class of one's own adds its schema's, on its runs only."""
    # imported here: validate imports the algorithms, which this module's importers may still be loading
    from algorithms import ALGORITHMS, algorithm_class
    from algorithms.schema import fill_missing, values_before
    from benchmarks.engine.validate import EnvConfig, RunConfig, TokenTaskEnvConfig

    later_algo_keys: dict = {}
    for algorithm in ALGORITHMS.values():
        for name, value in values_before(algorithm.Config).items():
            assert later_algo_keys.get(name, value) == value, f"two schemas say algo.{name} was {value} and " \
                                                              f"{later_algo_keys[name]} before it existed"
            later_algo_keys[name] = value
    kind = config.get("algo", {}).get("algorithm")
    if kind not in ALGORITHMS:
        try:
            later_algo_keys |= values_before(algorithm_class(kind).Config)
        except ValueError:  # a run of a retired name or of a module not importable here: the registry's keys
            pass
    token_task = config.get("env", {}).get("family") == "rlhf"  # a token task's own keys, on its runs only
    later = {**values_before(RunConfig), "env": values_before(TokenTaskEnvConfig if token_task else EnvConfig),
             "algo": later_algo_keys}
    return fill_missing(config, {name: value for name, value in later.items() if value != {}})


def task_kwargs(env_cfg) -> dict | None:
    """The task's own constructor arguments (env.kwargs; the token tasks': reward, temperature, ...)."""
    return OmegaConf.to_container(env_cfg.kwargs, resolve=True) if "kwargs" in env_cfg else None


def task_network(env_cfg) -> dict | None:
    """The task's policy network (env.network; None: the MLP of algo.hidden_sizes), its init_from a directory."""
    if "network" not in env_cfg:
        return None
    network = OmegaConf.to_container(env_cfg.network, resolve=True)
    if "init_from" in network:  # token tasks only (the [rlhf] extra)
        from benchmarks.rlhf.models import resolve_init_from

        network["init_from"] = resolve_init_from(network["init_from"])
    return network


# algo.backend values of committed runs that no code here trains: their runs stay as data (benchmarks.reproduce
# names them; a sweep counts them complete; their checkpoints are refused in one line).
RETIRED_BACKENDS = {"numpy": "a hand-derived gradient of PPO's loss; autograd computes it now"}


def numbers_relevant(config: dict) -> dict:
    """The config without what cannot change a logged number: logging switches and score metadata."""
    config = {k: v for k, v in with_later_keys(config).items() if k not in ("logging", "restart", "pause_at_steps",
                                                                                   "batched_physics")}
    # env.hparams and env.tuned are where the presets read their values from; the values used are in config["algo"].
    config["env"] = {k: v for k, v in config["env"].items()
                     if k not in ("random_score", "reference_score", "hparams", "tuned")}
    if config.get("seeds") is not None and list(config["seeds"]) == [config.get("seed")]:
        config["seeds"] = None  # a population of one is its seed alone: the same program, streams and numbers
    return config


def differing_keys(stored: dict, current: dict, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two configs (a key one of them lacks included), sorted: what a
    refusal to resume or to count a run as complete names (`algo.lr`, `seeds`)."""
    keys, lacking = [], object()  # a key one side lacks differs from the other's, None included
    for key in sorted(stored.keys() | current.keys(), key=str):
        a, b = stored.get(key, lacking), current.get(key, lacking)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            keys += differing_keys(a, b, f"{prefix}{key}.")
        else:
            keys.append(f"{prefix}{key}")
    return keys
