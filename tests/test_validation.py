"""Config validation: every key of every algo x env config has a rule; each bad value is one clear line."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import pytest
from omegaconf import OmegaConf

from benchmarks.engine.validate import (
    ENV_HPARAM_RULES,
    ConfigError,
    config_rules,
    validate_config,
)
from algorithms.hp3o import HP3O
from algorithms.ppo import PPO, PPOConfig
from algorithms.schema import Before, PositiveInt, number_between, one_of, positive_int
from benchmarks.engine.logger import flatten
from tests.conftest import ROOT

ALGOS = sorted(p.stem for p in (ROOT / "conf" / "algo").glob("*.yaml"))
ENVS = sorted(p.stem for p in (ROOT / "conf" / "env").glob("*.yaml"))


@pytest.mark.parametrize("algo", ALGOS)
def test_every_key_of_every_config_has_a_rule_and_every_shipped_config_passes(algo, make_config):
    for env in ENVS:
        cfg = make_config([f"algo={algo}", f"env={env}"])
        validate_config(cfg)
        data = OmegaConf.to_container(cfg, resolve=True)
        ruled = {rule[0] for rule in config_rules(data)}
        ruled |= {rule[0] for rule in ENV_HPARAM_RULES.values()} | {"algo.algorithm"}
        unchecked = [key for key in flatten(data)
                     if not any(key == r or key.startswith(r + ".") for r in ruled)]
        assert not unchecked, f"algo={algo} env={env}: keys without a validation rule: {unchecked}"


BAD_CONFIGS = [
    (["algo.lr=inf"], "algo.lr must be a number > 0, got inf"),
    (["algo.clip_coef=inf"], "algo.clip_coef must be a number > 0, got inf"),
    (["algo.max_grad_norm=nan"], "algo.max_grad_norm must be a number > 0, got nan"),
    (["env.obs_clip=inf"], "env.obs_clip must be a number > 0, got inf"),
    (["eval.episodes=1000000000"], "eval.episodes must be an integer in [1, 10000], got 1000000000"),
    (["seed=99999999999"], "seed must be an integer in [0, 4294967295], got 99999999999"),
    (["logging.checkpoint_every_steps=0"], "logging.checkpoint_every_steps must be an integer >= 1, got 0"),
    (["eval.episodes=0"], "eval.episodes must be an integer in [1, 10000], got 0"),
    (["eval.every_steps=-5"], "eval.every_steps must be an integer >= 1, got -5"),
    (["torch_threads=0"], "torch_threads must be an integer >= 1, got 0"),
    (["batched_physics=auto"], "batched_physics must be null (from 4 sub-envs on), true (whenever the task allows) "
                               "or false (Gymnasium's step), got 'auto'"),
    (["algo.algorithm=nosuch"], "algo.algorithm must be one of hp3o, outer_ppo, ppo, ppo_kl or "
                                "module:Class (a class of a module of one's own), got 'nosuch'"),
    (["algo.name=mine", "algo.algorithm=nosuchmodule:PPO"], "algo.algorithm=nosuchmodule:PPO: its module nosuchmodule "
     "cannot be imported (ModuleNotFoundError: No module named 'nosuchmodule')"),
    (["algo.name=mine", "algo.algorithm=algorithms.ppo:Nope"], "algo.algorithm=algorithms.ppo:Nope: module "
                                                               "algorithms.ppo has no Nope"),
    (["algo.name=mine", "algo.algorithm=algorithms.core:MLP"], "algo.algorithm=algorithms.core:MLP: "
     "algorithms.core.MLP is <class 'algorithms.core.MLP'>, not a class of the algorithm interface "
     "(algorithms.interface.Algorithm: PPO and its subclasses are)"),
    (["algo.name=mine", "algo.algorithm=algorithms.interface:Algorithm"], "algo.algorithm=algorithms.interface:"
     "Algorithm: algorithms.interface.Algorithm leaves methods of the algorithm interface abstract: act, "
     "act_deterministic, load_state_dict, named_parameters, state_dict, update, value (PPO implements them all)"),
    (["algo.algorithm=algorithms.ppo_kl:PPOKL", "+algo.kl_target=0.01", "+algo.kl_beta_init=1.0",
      "+algo.kl_tolerance=1.5", "+algo.kl_factor=2.0"], "algo.name=ppo is the preset conf/algo/ppo.yaml, whose algorithm "
     "is ppo: algo.algorithm=algorithms.ppo_kl:PPOKL under that name would be stored and reported as its runs; give the "
     "variant a name of its own (algo.name=<name>, or a preset conf/algo/<name>.yaml with `algorithm: "
     "algorithms.ppo_kl:PPOKL`)"),
    (["algo=hp3o_plus", "algo.algorithm=tests.test_validation:_HP3OVariant"], "algo.name=hp3o_plus is the preset "
     "conf/algo/hp3o_plus.yaml, whose algorithm is hp3o: algo.algorithm=tests.test_validation:_HP3OVariant under that "
     "name"),
    (["algo.name=mine", "algo.algorithm=tests.test_validation:_PlainKeyPPO"], "algo.algorithm=tests.test_validation:"
     "_PlainKeyPPO: the Config of tests.test_validation._PlainKeyPPO: Config.penalty: a schema key is annotated with "
     "its check (Annotated[type, Check]) or is a nested schema (a dataclass), got <class 'float'>: e.g. `penalty: "
     "NonNegativeFloat = 0.0` (algorithms/schema.py holds such types and the checks)"),
    (["algo.gae_lambda=1.5"], "algo.gae_lambda must be a number in [0, 1], got 1.5"),
    (["algo.target_kl=-0.01"], "algo.target_kl must be null or a number > 0, got -0.01"),
    (["algo.hidden_sizes=[]"], "algo.hidden_sizes must be a non-empty list of positive integers, got []"),
    (["algo.hidden_sizes=[64,0]"], "algo.hidden_sizes must be a non-empty list of positive integers, got [64, 0]"),
    (["algo.ent_coef=-0.01"], "algo.ent_coef must be a number >= 0, got -0.01"),
    (["algo.max_grad_norm=0"], "algo.max_grad_norm must be a number > 0, got 0"),
    (["env.obs_clip=0"], "env.obs_clip must be a number > 0, got 0"),
    (["env.normalize_obs=1"], "env.normalize_obs must be true or false, got 1"),
    (["env.family=atari"], "env.family must be one of classic, classic_continuous, mujoco, rlhf, got 'atari'"),
    (["env.name=a/b"], "env.name must be a non-empty name without '/', got 'a/b'"),
    (["env.reference_score=0"],
     "env.reference_score must be > env.random_score = 25.08 (scores are normalised by their difference), got 0"),
    (["env.hparams.lr=0"], "env.hparams.lr must be a number > 0, got 0"),
    (["+env.hparams.learning_rate=0.1"], "env.hparams.learning_rate is not a task-family hyperparameter"),
    (["algo=outer_ppo", "algo.outer_optimizer.type=rmsprop"],
     "algo.outer_optimizer.type must be one of sgd, adam, adamw, got 'rmsprop'"),
    (["algo=outer_ppo", "algo.inner_optimizer.lr=0"], "algo.inner_optimizer.lr must be a number > 0, got 0"),
    (["algo=outer_ppo", "algo.outer_optimizer.betas=[0.9]"],
     "algo.outer_optimizer.betas must be a list of two numbers in [0, 1), got [0.9]"),
    (["algo=outer_ppo", "algo.outer_optimizer.momentum=0.5"],
     "algo.outer_optimizer must be momentum 0 and nesterov false unless type is sgd"),
    (["algo=outer_ppo_nesterov", "algo.outer_optimizer.momentum=1.0"],
     "algo.outer_optimizer.momentum must be a number in [0, 1), got 1.0"),
    (["algo=outer_ppo", "algo.apply_to=critic"], "algo.apply_to must be one of all, actor, got 'critic'"),
    (["algo=outer_ppo", "algo.bias_coef=-1"], "algo.bias_coef must be a number >= 0, got -1"),
    (["algo=outer_ppo", "algo.inner_loop=minibatch"], "algo.inner_loop must be one of ppo, full_batch, got 'minibatch'"),
    (["algo=outer_ppo", "algo.inner_epochs=0"], "algo.inner_epochs must be an integer >= 1, got 0"),
    (["algo=hp3o", "algo.buffer_size=0"], "algo.buffer_size must be an integer >= 1, got 0"),
    (["algo=hp3o", "algo.trajectories_per_batch=99", "algo.buffer_size=10"],
     "algo.trajectories_per_batch must be <= algo.buffer_size = 10, got 99"),
    (["algo=hp3o", "algo.steps_per_batch=1", "algo.trajectories_per_batch=4"],
     "algo.steps_per_batch must be >= algo.trajectories_per_batch = 4 (at least one step per trajectory), got 1"),
    (["algo=hp3o", "algo.minibatch_size=0"], "algo.minibatch_size must be an integer >= 1, got 0"),
    (["algo=hp3o_plus", "algo.baseline_distance_threshold=0"],
     "algo.baseline_distance_threshold must be a number > 0, got 0"),
    (["algo.lr=-3e-4"], "algo.lr must be a number > 0, got -0.0003"),
    (["algo.clip_coef=0"], "algo.clip_coef must be a number > 0, got 0"),
    (["algo.clip_coef=-0.1"], "algo.clip_coef must be a number > 0, got -0.1"),
    (["algo.update_epochs=ten"], "algo.update_epochs must be an integer >= 1, got 'ten'"),
    (["algo.update_epochs=2.5"], "algo.update_epochs must be an integer >= 1, got 2.5"),
    (["algo.gamma=1.5"], "algo.gamma must be a number in (0, 1], got 1.5"),
    (["algo.anneal_lr=yes"], "algo.anneal_lr must be true or false, got 'yes'"),
    (["env.num_envs=0"], "env.num_envs must be an integer >= 1, got 0"),
    (["seed=-1"], "seed must be an integer in [0, 4294967295], got -1"),
    (["device=tpu"], "device must be one of cpu, got 'tpu'"),
    # keys no rule knows: a typo is refused, never silently ignored
    (["+algo.clip_coeff=0.1"], "algo.clip_coeff is not a key of this config: a typo, or a key of another algorithm "
                               "(keys of algo: adam_eps, algorithm, anneal_lr, backend, clip_coef,"),
    (["+foo=1"], "foo is not a key of this config"),
    (["algo=ppo", "+algo.outer_optimizer.lr=0.1"], "algo.outer_optimizer.lr is not a key of this config"),
    (["algo=outer_ppo", "+algo.outer_optimizer.lrr=0.1"],  # inside a block with a check of its own
     "algo.outer_optimizer.lrr is not a key of this config: a typo, or a key of another algorithm (keys of "
     "algo.outer_optimizer: anneal_lr, betas, eps, lr, momentum, nesterov, sigma_eff, type, weight_decay)"),
]


@pytest.mark.parametrize("overrides, message", BAD_CONFIGS, ids=[" ".join(o) for o, _ in BAD_CONFIGS])
def test_bad_configuration_gives_one_line_naming_key_and_range(overrides, message, make_config):
    with pytest.raises(ConfigError) as raised:
        validate_config(make_config(["env=CartPole", *overrides]))
    lines = str(raised.value).splitlines()
    assert any(message in line for line in lines), lines
    # One line per bad key; a bad env.hparams.* is named once, not again in the algo.* key that interpolates it.
    assert len(lines) == 1, lines



@pytest.mark.parametrize("preset_algorithm", ["tests.test_population:PPOWithActionPenalty", "ppo"])
def test_a_preset_of_ones_own_may_name_a_module_class_and_only_its_own(preset_algorithm, make_config, monkeypatch,
                                                                       tmp_path):
    """conf/algo/mine.yaml with `algorithm: module:Class` trains that class under its name; a module:Class typed over
    a preset of another algorithm would be reported as that preset's runs and is refused."""
    import benchmarks.engine.validate

    (tmp_path / "mine.yaml").write_text(f"defaults: [ppo, _self_]\nname: mine\nalgorithm: {preset_algorithm}\n")
    monkeypatch.setattr(benchmarks.engine.validate, "ALGO_PRESETS", tmp_path)
    config = make_config(["env=CartPole", "algo.name=mine", "algo.algorithm=tests.test_population:PPOWithActionPenalty"])
    if preset_algorithm != "ppo":
        validate_config(config)
        # the class a preset's registry key names, typed by its module:Class name, is that preset's own
        validate_config(make_config(["env=CartPole", "algo=ppo_kl", "algo.algorithm=algorithms.ppo_kl:PPOKL"]))
        return
    with pytest.raises(ConfigError, match="^algo.name=mine is the preset conf/algo/mine.yaml, whose algorithm is ppo: "):
        validate_config(config)


def test_the_retired_numpy_backend_is_refused_in_one_line_and_every_ppo_variant_defaults_to_the_compiled_engine(
        make_config, monkeypatch):
    import algorithms
    from algorithms.ppo import PPO

    with pytest.raises(ConfigError) as raised:
        validate_config(make_config(["env=CartPole", "algo=ppo", "algo.backend=numpy"]))
    assert str(raised.value) == ("algo.backend must be compiled or torch (the numpy backend, a hand-derived gradient "
                                 "of PPO's loss, is retired), got 'numpy'")
    # a variant that changes the loss trains on the population engine, which differentiates its own loss
    ChangedLoss = type("ChangedLoss", (PPO,), {"loss_terms": lambda self, *args: PPO.loss_terms(self, *args)})
    monkeypatch.setitem(algorithms.ALGORITHMS, "ppo", ChangedLoss)
    assert make_config(["env=CartPole", "algo=ppo"]).algo.backend == "compiled"


OPTIMIZER_KEYS = ["type", "lr", "momentum", "nesterov", "betas", "eps", "weight_decay"]


def test_outer_ppo_optimizers_come_from_the_optimizer_group(make_config):
    # each preset selects two of conf/optimizer/ and sets only what differs
    expected = {"outer_ppo": ("sgd", "adamw"), "outer_ppo_lr": ("adam", "sgd"),
                "outer_ppo_nesterov": ("adam", "sgd"), "outer_ppo_biased": ("adam", "sgd")}
    for preset, (inner, outer) in expected.items():
        algo = make_config([f"algo={preset}", "env=CartPole"]).algo
        assert (algo.inner_optimizer.type, algo.outer_optimizer.type) == (inner, outer)
        for block in (algo.inner_optimizer, algo.outer_optimizer):
            assert list(block)[:len(OPTIMIZER_KEYS)] == OPTIMIZER_KEYS
    # PPO's own Adam as the paper variants' inner optimizer: PPO's lr and eps, read through
    algo = make_config(["algo=outer_ppo_lr", "env=CartPole", "algo.lr=1e-3", "algo.adam_eps=1e-7"]).algo
    assert (algo.inner_optimizer.lr, algo.inner_optimizer.eps) == (1e-3, 1e-7)
    # another optimizer from the command line: the group's defaults, the preset's own values kept
    cfg = make_config(["algo=outer_ppo_lr", "env=CartPole", "optimizer@algo.outer_optimizer=adamw"])
    validate_config(cfg)
    outer = cfg.algo.outer_optimizer
    assert (outer.type, outer.weight_decay, outer.betas, outer.anneal_lr) == ("adamw", 0.01, [0.9, 0.999], False)
    assert outer.lr == make_config(["algo=outer_ppo_lr", "env=CartPole"]).algo.outer_optimizer.lr


def test_a_preset_that_forgets_an_optimizers_lr_gets_one_line(make_config):
    cfg = make_config(["algo=outer_ppo_lr", "env=CartPole", "optimizer@algo.outer_optimizer=sgd"])
    cfg.algo.outer_optimizer.lr = "???"  # the group's lr is mandatory: a preset must set it
    with pytest.raises(ConfigError, match=r"^algo.outer_optimizer.lr must be a number >= 0, got '\?\?\?'$"):
        validate_config(cfg)


def test_every_algorithm_declares_its_schema_and_old_runs_get_the_values_they_ran_with():
    import dataclasses

    from algorithms import ALGORITHMS
    from algorithms.ppo import PPOConfig
    from benchmarks.engine.config import with_later_keys

    for kind, algorithm in ALGORITHMS.items():
        assert dataclasses.is_dataclass(algorithm.Config) and issubclass(algorithm.Config, PPOConfig), kind
    # a run stored before algo.backend, Outer-PPO's inner loop and batches existed ran torch, PPO's loop, one seed
    stored = {"seed": 3, "env": {"name": "CartPole"}, "algo": {"name": "outer_ppo_lr", "lr": 1e-3}}
    # (and no pause, and an outer step set by its lr: sigma_eff null)
    assert with_later_keys(stored) == {"seed": 3, "seeds": None, "pause_at_steps": None, "batched_physics": None,
                                       "env": {"name": "CartPole"},
                                       "algo": {"name": "outer_ppo_lr", "lr": 1e-3, "backend": "torch",
                                                "inner_loop": "ppo", "inner_epochs": 4,
                                                "outer_optimizer": {"sigma_eff": None}}}
    newer = {"seed": 3, "seeds": [3, 4], "env": {"name": "CartPole"}, "algo": {"backend": "numpy"}}
    assert with_later_keys(newer)["seeds"] == [3, 4] and with_later_keys(newer)["algo"]["backend"] == "numpy"


class _HP3OVariant(HP3O):
    """A variant of HP3O of one's own (module:Class), with HP3O's keys."""


class _PlainKeyPPO(PPO):
    """A variant whose key of its own is a plain float, with no check."""

    @dataclasses.dataclass
    class Config(PPOConfig):
        penalty: float = 0.0


@dataclasses.dataclass
class _ConfigWithAKeyAddedSince(PPOConfig):
    smoothing: Annotated[float, number_between(0, 1), Before(0.0)]


class _PPOWithAKeyAddedSince(PPO):
    """A variant of one's own (module:Class) that gained a key after runs of it were stored."""
    Config = _ConfigWithAKeyAddedSince


def test_a_variant_of_ones_own_fills_the_keys_its_stored_runs_predate():
    from benchmarks.engine.config import with_later_keys

    stored = {"seed": 0, "env": {"name": "CartPole"},
              "algo": {"name": "mine", "algorithm": "tests.test_validation:_PPOWithAKeyAddedSince", "backend": "compiled"}}
    assert with_later_keys(stored)["algo"]["smoothing"] == 0.0
    assert "smoothing" not in with_later_keys({**stored, "algo": {**stored["algo"], "algorithm": "ppo"}})["algo"]


@dataclasses.dataclass
class _Block:
    old: PositiveInt
    added: Annotated[int, positive_int(), Before(7)]


@dataclasses.dataclass
class _Schema:
    top: Annotated[str, one_of(["a", "b"]), Before("a")]
    inner: _Block


def test_a_key_added_inside_a_block_is_filled_too():
    from algorithms.schema import fill_missing, values_before

    assert values_before(_Schema) == {"top": "a", "inner": {"added": 7}}
    assert fill_missing({"inner": {"old": 1}}, values_before(_Schema)) == {"inner": {"old": 1, "added": 7}, "top": "a"}
    assert fill_missing({"top": "b", "inner": {"old": 1, "added": 2}}, values_before(_Schema)) == \
        {"top": "b", "inner": {"old": 1, "added": 2}}


@dataclasses.dataclass
class _Unchecked:
    checked_key: PositiveInt
    bare_key: int


def test_a_schema_key_without_a_check_is_refused_by_name():
    from algorithms.schema import rules_of_schema

    with pytest.raises(TypeError, match=r"_Unchecked\.bare_key: a schema key is annotated with its check"):
        rules_of_schema(_Unchecked, "algo")


EXPERIMENTS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))


def sweep_jobs(experiment: str) -> list[list[str]]:
    """Every job of an experiment's sweep as its overrides: the product of its swept keys' values (a list value,
    seeds=[...], is one value; the seeds of a sweep over `seed` are left at one, they change no validation)."""
    import itertools

    params = OmegaConf.load(ROOT / "conf" / "experiment" / f"{experiment}.yaml").hydra.sweeper.params
    axes = [[f"{key}={value}"] if str(value).startswith("[") else [f"{key}={v}" for v in str(value).split(",")]
            for key, value in params.items() if key != "seed"]
    return [[f"+experiment={experiment}", *job] for job in itertools.product(*axes)]


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_job_of_every_experiment_composes_and_passes_validation(experiment, make_config):
    """A suite's command must not fail on its 30th job: each job of its sweep is a valid config (a preset whose
    loss a pinned backend cannot run, a task or key that does not exist, ...)."""
    jobs = sweep_jobs(experiment)
    if any("env=RLHF" in override for job in jobs for override in job):
        pytest.importorskip("transformers", reason="the token tasks need the optional extra: pip install -e .[rlhf]")
    for job in jobs:
        validate_config(make_config(job))


@pytest.mark.parametrize("tune", sorted(p.stem for p in (ROOT / "conf" / "tune").glob("*.yaml")))
def test_every_preset_a_study_can_search_composes_and_passes_validation(tune, make_config):
    """A study's trials are configs too: every preset with a search space in conf/tune/<tune>.yaml passes (a
    backend pinned there that cannot run a preset's loss would refuse every trial), and so does its space (every
    key there, read by the preset)."""
    from benchmarks.tuning import search_space_problems, tune_config

    spaces = tune_config(tune)["hydra"]["sweeper"]["search_spaces"]
    presets = [name for name in spaces if name in ALGOS]
    assert presets
    for name, space in spaces.items():  # a study of its own name (outer_ppo_full_batch) searches its preset's config
        algo = max((preset for preset in ALGOS if name == preset or name.startswith(f"{preset}_")), key=len)
        config = make_config(["hydra/sweeper=tune", f"+tune={tune}", f"algo={algo}"])
        if name in presets:
            validate_config(config)
        space = {key: spec for key, spec in space.items() if spec is not None}
        assert search_space_problems(name, space, config) == [], name


def test_an_interpolation_that_cannot_resolve_is_one_line_naming_its_key(make_config):
    with pytest.raises(ConfigError) as refused:
        validate_config(make_config(["algo.lr=${env.hparams.nope}"]))
    assert str(refused.value) == "config does not resolve: algo.lr: Interpolation key 'env.hparams.nope' not found"
