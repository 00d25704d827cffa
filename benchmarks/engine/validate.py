"""Config validation: every error is one line naming the key and the allowed range, before any env exists."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Annotated
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf

from algorithms import algorithm_class
from algorithms.ppo import PPO, PPOConfig
from algorithms.schema import (
    Before,
    Check,
    Flag,
    Name,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    Rule,
    is_int,
    is_number,
    mapping_of_mappings,
    number,
    one_of,
    positive_int,
    rules_of_schema,
)
from benchmarks.engine.config import MAX_SEED
from benchmarks.engine.logger import flatten


def seed_dir(seed, seeds) -> str:
    """The last part of a run directory (conf/config.yaml): seed<k>, or for a batch (seeds=[...]) the job's
    own directory, seeds<first>-<last> (or seeds<a>_<b>_... when not consecutive), beside its seeds' seed<k>."""
    if seeds is None:
        return f"seed{seed}"
    if isinstance(seeds, str) or not all(is_int(s) for s in seeds):
        return "seeds-invalid"  # seeds=abc: the validator refuses it in one line before anything runs
    seeds = [int(s) for s in seeds]
    if not seeds:
        return "seeds-invalid"
    if seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"seeds{seeds[0]}-{seeds[-1]}"
    return "seeds" + "_".join(map(str, seeds))


OmegaConf.register_new_resolver("seed_dir", seed_dir, replace=True)

# A run directory's name of overrides (conf/config.yaml: Hydra joins them, key=value,...) is kept to this many bytes:
# a file system allows 255 per name, and a run given a dozen values of its own would otherwise fail to start.
MAX_OVERRIDES_NAME = 200


def overrides_dir(name: str) -> str:
    """The overrides' part of a run directory: Hydra's name for them, or where that is longer than
    MAX_OVERRIDES_NAME bytes its beginning and a digest of the whole, so that the same overrides still name the
    same directory (and skip or resume there) and others another."""
    if len(name.encode()) <= MAX_OVERRIDES_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    head = name.encode()[:MAX_OVERRIDES_NAME - len(digest) - 10].decode(errors="ignore")
    return f"{head}...sha256-{digest}"


OmegaConf.register_new_resolver("overrides_dir", overrides_dir, replace=True)


def fastest_backend(algorithm: str) -> str:
    """algo.backend's default for an algorithm (conf/algo/ppo.yaml): the population engine (compiled), which
    differentiates the algorithm's own torch loss over a seed axis, for PPO and every variant of it; torch (the
    eager backend, which runs any update) for an algorithm of its own that is no PPO, and for a variant that
    overrides how a seed acts (act, value), which a population does not call. A run's summary.json holds the
    resolved value, the backend it ran on."""
    from algorithms.population import acting_overrides

    try:
        known = algorithm_class(algorithm)
    except ValueError:
        return "compiled"  # an unknown algorithm: the validator refuses it in one line
    if not issubclass(known, PPO):
        return "torch"
    if acting_overrides(known):  # a population acts with the policy, not the algorithm's act
        return "torch"
    return "compiled"


OmegaConf.register_new_resolver("fastest_backend", fastest_backend, replace=True)


class ConfigError(ValueError):
    """A bad configuration value; str(error) is one line per problem."""


@dataclass
class EvalConfig:
    every_steps: PositiveInt
    episodes: Annotated[int, positive_int(maximum=10_000)]
    at_start: Flag


@dataclass
class LoggingConfig:
    tensorboard: Flag
    progress_bar: Flag
    checkpoint: Flag
    checkpoint_every_steps: PositiveInt


REFERENCE_SCORE = Check(lambda v: v is None or is_number(v), "null (left out of normalised scores) or a number")


@dataclass
class EnvConfig:
    """env.* (conf/env/<task>.yaml over conf/env_family/<family>.yaml)."""
    name: Name
    family: Annotated[str, one_of(["classic", "classic_continuous", "mujoco", "rlhf"])]
    id: Annotated[str, Check(lambda v: isinstance(v, str) and len(v) > 0, "a Gymnasium id string")]
    total_steps: PositiveInt
    eval_every_steps: PositiveInt
    eval_episodes: PositiveInt
    random_score: Annotated[float, number()]
    reference_score: Annotated[float | None, REFERENCE_SCORE]
    num_envs: PositiveInt
    num_steps: PositiveInt
    normalize_obs: Flag
    scale_reward: Flag
    obs_clip: PositiveFloat
    reward_clip: PositiveFloat
    # each preset's values (conf/tuned/<family>.yaml or a conf/tuning round); each is range-checked where its
    # preset reads it (algo.*)
    tuned: Annotated[dict, mapping_of_mappings("a mapping: preset name -> its tuned values")]


TOKEN_TASKS = ("arithmetic", "praise")  # benchmarks/rlhf/tasks.py (named here: no transformers import to validate)


TOKEN_POLICY_SOURCE = Check(
    lambda v: isinstance(v, str) and (v.removeprefix("rlhf/") in TOKEN_TASKS if v.startswith("rlhf/")
                                      else Path(v).is_dir()),
    f"rlhf/<task> (the task's cached reference model; tasks: {', '.join(TOKEN_TASKS)}) or an existing model "
    f"directory")


@dataclass
class TokenPolicyConfig:
    kind: Annotated[str, one_of(["causal_lm"])]
    init_from: Annotated[str, TOKEN_POLICY_SOURCE]
    temperature: PositiveFloat


EOS_PENALTY = Check(lambda v: v is None or (is_number(v) and v >= 0), "null (no penalty) or a number >= 0")


@dataclass
class TokenTaskArguments:
    reward: Annotated[str, one_of(["model", "judge"])]
    temperature: PositiveFloat
    missing_eos_penalty: Annotated[float | None, EOS_PENALTY]
    # same_step: every env step writes a token (the budget counts generated tokens); next_step: the step after a
    # response is a no-op that counts as an env step, as runs stored before this key ran
    autoreset: Annotated[str, one_of(["same_step", "next_step"]), Before("next_step")]


@dataclass
class KLPenaltyConfig:
    coef: NonNegativeFloat
    adaptive: Flag
    target: PositiveFloat
    horizon: PositiveFloat


@dataclass
class TokenEvaluationConfig:
    """How a token task is evaluated (benchmarks/rlhf/evaluation.py): sampled responses at the training temperature
    to eval.episodes fixed prompts, prompts and samples drawn from `seed` at every evaluation; or greedy responses
    to fresh prompts (the shared Evaluator), as runs stored before this key ran."""
    kind: Annotated[str, one_of(["sampled", "greedy"]), Before("greedy")]
    seed: Annotated[int, positive_int(minimum=0, maximum=MAX_SEED), Before(0)]


@dataclass
class TokenTaskEnvConfig(EnvConfig):
    """The token tasks' own keys (conf/env_family/rlhf.yaml): the policy network, the env's arguments, the KL
    penalty to the reference model. Allowed in that family only."""
    backend: Annotated[str, one_of(["torch"])]
    network: TokenPolicyConfig
    kwargs: TokenTaskArguments
    kl_penalty: KLPenaltyConfig
    whiten_rewards: Flag
    evaluation: TokenEvaluationConfig


SEED_BATCH = Check(
    lambda v: v is None or (isinstance(v, list) and len(v) > 0 and len(set(v)) == len(v)
                            and all(is_int(s) and 0 <= s <= MAX_SEED for s in v)),
    f"null (one seed, `seed`) or a list of distinct integers in [0, {MAX_SEED}] trained as one batch")


PAUSE_AT = Check(lambda v: v is None or (is_int(v) and v > 0), "null (train to total_steps) or an integer > 0")
BATCHED_PHYSICS = Check(lambda v: v is None or isinstance(v, bool),
                        "null (from 4 sub-envs on), true (whenever the task allows) or false (Gymnasium's step)")


@dataclass
class RunConfig:
    """The keys every run has (conf/config.yaml); algo.* is its algorithm's Config, env.* its family's."""
    seed: Annotated[int, positive_int(minimum=0, maximum=MAX_SEED)]
    seeds: Annotated[list[int] | None, SEED_BATCH, Before(None)]
    restart: Flag
    total_steps: PositiveInt
    pause_at_steps: Annotated[int | None, PAUSE_AT, Before(None)]
    batched_physics: Annotated[bool | None, BATCHED_PHYSICS, Before(None)]
    device: Annotated[str, one_of(["cpu"])]
    torch_threads: PositiveInt
    eval: EvalConfig
    logging: LoggingConfig


# env.hparams: the task family's PPO defaults, which the algo presets interpolate
# (algo.lr: ${env.hparams.lr}); any subset of these keys, each in its algo.* range.
ENV_HPARAM_RULES: dict[str, Rule] = {
    key.removeprefix("algo."): (key.replace("algo.", "env.hparams.", 1), check, allowed)
    for key, check, allowed in rules_of_schema(PPOConfig, "algo")
    if key in ("algo.lr", "algo.gamma", "algo.gae_lambda", "algo.update_epochs", "algo.num_minibatches",
                    "algo.ent_coef", "algo.vf_coef", "algo.clip_coef", "algo.max_grad_norm")
}


def algorithm_rules(kind: str) -> list[Rule]:
    """The rules of algo.* for one algorithm kind (the `algorithm` key of a preset), from its Config."""
    return rules_of_schema(algorithm_class(kind).Config, "algo")


def config_rules(data: dict) -> list[Rule]:
    """Every rule a resolved config is checked against: the run's, its algorithm's, its task family's."""
    token_task = data.get("env", {}).get("family") == "rlhf"
    return (rules_of_schema(RunConfig, "") + rules_of_schema(TokenTaskEnvConfig if token_task else EnvConfig, "env")
            + algorithm_rules(data["algo"]["algorithm"]))


def get_dotted(container: dict, dotted: str):
    """container['a']['b'] for 'a.b'; KeyError if a part is missing."""
    node = container
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def unresolved(error: Exception) -> str:
    """An interpolation that cannot resolve, in one line: OmegaConf's message and the key (its message goes on with
    full_key and object_type lines)."""
    where, message = getattr(error, "full_key", None), (str(error).splitlines() or [type(error).__name__])[0]
    return f"config does not resolve: {f'{where}: ' if where else ''}{message}"


def validate_config(cfg: DictConfig) -> None:
    """Raise ConfigError listing every invalid key, one line each."""
    try:
        data = OmegaConf.to_container(cfg, resolve=True)
    except Exception as error:  # an interpolation that cannot resolve
        raise ConfigError(unresolved(error)) from None
    errors: list[str] = []

    kind = data.get("algo", {}).get("algorithm")
    try:
        algorithm_class(kind)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    rules = config_rules(data)

    hparams = data.get("env", {}).get("hparams", {})
    bad_hparams = {}  # name -> value of each invalid env.hparams.* key
    for hparam, value in (hparams.items() if isinstance(hparams, dict) else []):
        if hparam not in ENV_HPARAM_RULES:
            errors.append(f"env.hparams.{hparam} is not a task-family hyperparameter "
                          f"(known: {', '.join(ENV_HPARAM_RULES)})")
            continue
        key, check, allowed = ENV_HPARAM_RULES[hparam]
        if not check(value):
            errors.append(refusal(key, check, allowed, value))
            bad_hparams[hparam] = value

    for key, check, allowed in rules:
        try:
            value = get_dotted(data, key)
        except KeyError:
            errors.append(f"{key} is missing (must be {allowed})")
            continue
        inherited = key.startswith("algo.") and bad_hparams.get(key.removeprefix("algo."), object()) == value
        if not check(value) and not inherited:  # an algo.* value read from a bad env.hparams.* is said there once
            errors.append(refusal(key, check, allowed, value))

    errors += _unknown_keys(data, rules)

    if not errors:
        errors += _cross_checks(data)
    if errors:
        raise ConfigError("\n".join(errors))


def refusal(key: str, check, allowed: str, value) -> str:
    """The line refusing a value; a whole number given as a float (`total_steps=1e6`, which Hydra reads as
    1000000.0) where that integer would do says how to write it."""
    hint = (f" (a float: write the integer, {int(value)})" if isinstance(value, float) and value.is_integer()
            and check(int(value)) else "")
    return f"{key} must be {allowed}, got {value!r}{hint}"


# Lookup tables an experiment config reads through interpolation (what they feed is checked where it lands).
HELPER_KEYS = {"ci_budget"}  # conf/experiment/regression_ci.yaml: per-task budget of the CI suite


def _unknown_keys(data: dict, rules: list[Rule]) -> list[str]:
    """A key no rule knows is a typo (`+algo.clip_coeff=0.1`) or belongs to no algorithm here: refused,
    never silently ignored. env.hparams.* and env.tuned.* are checked where they are read."""
    ruled = {key for key, _, _ in rules}
    # a block's own check (an optimizer's) names the block: its keys are known one by one, not by the prefix
    blocks = {key for key in ruled if any(other.startswith(key + ".") for other in ruled)}
    known = (ruled - blocks) | {"env.hparams"} | HELPER_KEYS
    errors = []
    for key in flatten(data):  # dotted keys of every non-mapping value
        if not any(key == k or key.startswith(k + ".") for k in known):
            section = key.rsplit(".", 1)[0] if "." in key else None
            siblings = sorted(k.rsplit(".", 1)[1] for k in known if section and k.startswith(section + ".")
                              and k.count(".") == key.count("."))
            hint = f" (keys of {section}: {', '.join(siblings)})" if siblings else ""
            owner = {"env": "task", "algo": "algorithm"}.get(key.split(".")[0])
            other = f", or a key of another {owner}" if owner else ""
            errors.append(f"{key} is not a key of this config: a typo{other}{hint}")
    return errors


def population_check(cls: type, algo: dict) -> list[str]:
    """What algorithms/population.py cannot run, found on a small instance of the algorithm (its optimizer is
    what it builds, whatever its code says): one line each, before any environment exists."""
    from algorithms.population import forward_problems, loss_problems, population_problems

    try:
        instance = cls(3, 2, False, algo, 1)
    except Exception:  # a config the other checks refuse; they say why
        return []
    problems = population_problems(instance) or forward_problems(instance, 3) or loss_problems(instance, 3, (2,))
    return [f"algo.backend=compiled: {problem}" for problem in problems]


def task_problems(env: dict) -> list[str]:
    """The task must exist before a run directory or a log line does: a Gymnasium id (a module-qualified one,
    module:Id, names the module that registers it), and the token tasks' optional dependencies installed."""
    import importlib.util

    import gymnasium

    if env.get("family") == "rlhf" and importlib.util.find_spec("transformers") is None:
        return [f"env={env['name']} (a token task) needs the [rlhf] extra, which is not installed: "
                f"pip install -e '.[rlhf]'"]
    env_id = env["id"]
    module, _, name = env_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except ImportError as error:
            return [f"env.id={env_id}: its module {module} cannot be imported ({error})"]
    if name not in gymnasium.registry:
        return [f"env.id must be a registered Gymnasium id (a MuJoCo v5 or classic-control id, or module:Id), "
                f"got {env_id!r}"]
    return made_task_problems(env)


def made_task_problems(env: dict) -> list[str]:
    """One instance of the task, made and closed: a missing dependency (Box2D), arguments it refuses (env.kwargs)
    or spaces the policies cannot read are said here, in one line. A task registered only as a vector env (the
    token tasks, whose models take seconds to load) is made by its run alone."""
    import gymnasium

    from benchmarks.engine.envs import find_spec, install_mujoco_warning_handler, space_problem

    env_id = env["id"]
    if find_spec(env_id).entry_point is None:
        return []
    kwargs = env.get("kwargs") or {}
    install_mujoco_warning_handler()
    try:
        instance = gymnasium.make(env_id, disable_env_checker=True, **kwargs)
    except Exception as error:
        given = f" with env.kwargs={kwargs}" if kwargs else ""
        return [f"env.id={env_id} cannot be made{given}: {type(error).__name__}: {error}"]
    try:
        problem = (space_problem(env_id, instance.observation_space, instance.action_space)
                   or api_problem(env_id, instance))
    finally:
        instance.close()
    return [problem] if problem is not None else []


def api_problem(env_id: str, instance) -> str | None:
    """Why the task does not follow Gymnasium's API in one reset and one step (None: it does): reset() returns
    (observation, info), step() returns (observation, reward, terminated, truncated, info) with one number for
    the reward, and each observation has its observation space's shape. A task written for the old gym API
    (four values from step), or whose observations disagree with its space, would otherwise fail mid-run with
    numpy's or Python's words."""
    instance.action_space.seed(0)
    old_gym = "(observation, reward, terminated, truncated, info): Gymnasium's API, not the old gym's"
    calls = {"reset": (lambda: instance.reset(seed=0), 2, "(observation, info)"),
             "step": (lambda: instance.step(instance.action_space.sample()), 5, old_gym)}
    for name, (call, count, expected) in calls.items():
        try:
            result = call()
        except Exception as error:
            if name == "step" and "expected 5, got 4" in str(error):  # Gymnasium's TimeLimit unpacked the four itself
                return f"env.id={env_id}: its step() returns 4 values, where 5 are expected {old_gym}"
            return f"env.id={env_id}: its {name}() fails: {type(error).__name__}: {error}"
        if not isinstance(result, (tuple, list)) or len(result) != count:
            got = f"{len(result)} values" if isinstance(result, (tuple, list)) else f"a {type(result).__name__}"
            return f"env.id={env_id}: its {name}() returns {got}, where {count} are expected {expected}"
        shape = readable_shape(result[0])
        if shape != instance.observation_space.shape:
            got = "an observation that is not one array" if shape is None else f"an observation of shape {shape}"
            return f"env.id={env_id}: its {name}() returns {got}, where its observation space says " \
                   f"{instance.observation_space.shape}"
        if name == "step":
            reward_shape = readable_shape(result[1])
            if reward_shape != () or np.asarray(result[1]).dtype.kind not in "biuf":
                reward = repr(result[1]) if reward_shape == () else f"of shape {reward_shape}"  # one line, any size
                return f"env.id={env_id}: its step() returns a reward {reward}, where one number is expected"
    return None


def readable_shape(value) -> tuple | None:
    """numpy's shape of a value, None for one numpy cannot read as an array (ragged lists)."""
    try:
        return np.shape(value)
    except ValueError:
        return None


ALGO_PRESETS = Path(__file__).resolve().parents[2] / "conf" / "algo"


def same_class(kind: str, cls: type) -> bool:
    """Whether algo.algorithm=kind names the class cls (a registry key and its module:Class name the same)."""
    try:
        return algorithm_class(kind) is cls
    except ValueError:
        return False


def preset_algorithm(name: str) -> str | None:
    """The `algorithm` of the preset conf/algo/<name>.yaml, read through its defaults (hp3o_plus's is hp3o's); None
    where no such preset exists."""
    path = ALGO_PRESETS / f"{name}.yaml"
    if not isinstance(name, str) or not path.is_file():
        return None
    preset = OmegaConf.load(path)
    if "algorithm" in preset:
        return preset.algorithm
    parents = [entry for entry in preset.get("defaults", []) if isinstance(entry, str) and entry != "_self_"]
    return next((found for found in map(preset_algorithm, parents) if found is not None), None)


MAX_HIDDEN_WEIGHTS = 50_000_000  # weights between hidden layers of one network: 200 MB each in float32


def network_size_problems(algo: dict) -> list[str]:
    """A network too large to allocate is refused before anything is built, not by the allocator's traceback."""
    sizes = algo.get("hidden_sizes")
    if not isinstance(sizes, list) or not all(is_int(size) and size > 0 for size in sizes):
        return []  # its own check says why
    weights = sum(a * b for a, b in zip(sizes[:-1], sizes[1:]))
    if weights > MAX_HIDDEN_WEIGHTS:
        return [f"algo.hidden_sizes={sizes} gives {weights:,} weights between hidden layers per network; at most "
                f"{MAX_HIDDEN_WEIGHTS:,} (the suite's policies are small MLPs; 64x64 is the default)"]
    return []


def token_vocabulary_problems(env: dict) -> list[str]:
    """The policy's model (env.network.init_from) must write the task's tokens: its vocabulary is the task's action
    space (rlhf/<task> names that task's; a model directory's config.json says its size)."""
    import json

    from benchmarks.engine.envs import find_spec
    from benchmarks.rlhf.tasks import get_task

    task = find_spec(env["id"]).kwargs.get("task")
    init_from = env["network"]["init_from"]
    if task is None:
        return []
    if init_from.startswith("rlhf/"):
        size = len(get_task(init_from.removeprefix("rlhf/")).vocabulary)
    else:
        try:
            size = json.loads((Path(init_from) / "config.json").read_text())["vocab_size"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            return [f"env.network.init_from={init_from} is not a model directory with a config.json giving its "
                    f"vocab_size ({type(error).__name__}: {error})"]
    tokens = len(get_task(task).vocabulary)
    if size != tokens:
        return [f"env.network.init_from={init_from}: its vocabulary has {size} tokens, the {task} task's "
                f"{tokens} (env={env['name']}): the policy's model must write the task's tokens"]
    return []


def _cross_checks(data: dict) -> list[str]:
    errors = task_problems(data["env"])
    env, algo = data["env"], data["algo"]
    rollout = env["num_envs"] * env["num_steps"]
    if data["total_steps"] < rollout:
        errors.append(
            f"total_steps must be >= one rollout (env.num_envs * env.num_steps = {rollout}), got {data['total_steps']}"
        )
    if data["pause_at_steps"] is not None and not data["logging"]["checkpoint"]:
        errors.append(f"pause_at_steps={data['pause_at_steps']} needs logging.checkpoint=true: a paused run "
                      f"resumes from the checkpoint it writes there")
    errors += network_size_problems(algo)
    algorithm = algorithm_class(algo["algorithm"])
    named = preset_algorithm(algo["name"])
    if named is not None and not same_class(named, algorithm):
        errors.append(f"algo.name={algo['name']} is the preset conf/algo/{algo['name']}.yaml, whose algorithm is "
                      f"{named}: algo.algorithm={algo['algorithm']} under that name would be stored and reported as "
                      f"its runs; give the variant a name of its own (algo.name=<name>, or a preset "
                      f"conf/algo/<name>.yaml with `algorithm: {algo['algorithm']}`)")
    errors += algorithm.check_config(algo, rollout)  # the algorithm's own checks of keys that relate
    if algo["backend"] == "compiled" and not errors:
        errors += population_check(algorithm, algo)
    if env["family"] == "rlhf":
        if algo["backend"] != "torch":  # compiled: the population step runs MLP policies
            errors.append(f"algo.backend must be torch on token tasks (env.family=rlhf): the compiled "
                          f"backend runs MLP policies only, got {algo['backend']!r}")
        if env["kwargs"]["temperature"] != env["network"]["temperature"]:
            errors.append(f"env.kwargs.temperature must equal env.network.temperature (the reference's log-probabilities "
                          f"must be of the same tempered distribution as the policy's), got {env['kwargs']['temperature']} "
                          f"and {env['network']['temperature']}")
        if env["normalize_obs"]:
            errors.append("env.normalize_obs must be false on token tasks (env.family=rlhf): the observations are "
                          "token ids, which a running normaliser would turn into numbers that name no token")
        if not errors:
            errors += token_vocabulary_problems(env)
    if env["reference_score"] is not None and env["reference_score"] <= env["random_score"]:
        errors.append(f"env.reference_score must be > env.random_score = {env['random_score']} (scores are "
                      f"normalised by their difference), got {env['reference_score']}")
    return errors
