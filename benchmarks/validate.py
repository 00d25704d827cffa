"""Config validation: every error is one line naming the key and the allowed range, before any env exists."""

from __future__ import annotations

import math
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf


def seed_dir(seed, seeds) -> str:
    """The last part of a run directory (conf/config.yaml): seed<k>, or for a batch (seeds=[...]) the job's
    own directory, seeds<first>-<last> (or seeds<a>_<b>_... when not consecutive), beside its seeds' seed<k>."""
    if seeds is None:
        return f"seed{seed}"
    seeds = [int(s) for s in seeds]
    if seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"seeds{seeds[0]}-{seeds[-1]}"
    return "seeds" + "_".join(map(str, seeds))


OmegaConf.register_new_resolver("seed_dir", seed_dir, replace=True)


class ConfigError(ValueError):
    """A bad configuration value; str(error) is one line per problem."""


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    """A finite int or float (inf and nan are refused wherever a number is read)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# A rule: (key, check(value) -> bool, allowed-range text)
Rule = tuple[str, Callable[[Any], bool], str]


def positive_int(key: str, minimum: int = 1, maximum: int | None = None) -> Rule:
    if maximum is None:
        return key, lambda v: _is_int(v) and v >= minimum, f"an integer >= {minimum}"
    return key, lambda v: _is_int(v) and minimum <= v <= maximum, f"an integer in [{minimum}, {maximum}]"


def positive_number(key: str) -> Rule:
    return key, lambda v: _is_number(v) and v > 0, "a number > 0"


def non_negative_number(key: str) -> Rule:
    return key, lambda v: _is_number(v) and v >= 0, "a number >= 0"


def unit_interval(key: str, low_open: bool = False) -> Rule:
    text = "a number in (0, 1]" if low_open else "a number in [0, 1]"
    return key, lambda v: _is_number(v) and (v > 0 if low_open else v >= 0) and v <= 1, text


def boolean(key: str) -> Rule:
    return key, lambda v: isinstance(v, bool), "true or false"


def optional_positive_number(key: str) -> Rule:
    return key, lambda v: v is None or (_is_number(v) and v > 0), "null or a number > 0"


def one_of(key: str, options) -> Rule:
    return key, lambda v: v in options, "one of " + ", ".join(map(str, options))


def name(key: str) -> Rule:
    return key, lambda v: isinstance(v, str) and len(v) > 0 and "/" not in v, "a non-empty name without '/'"


def number(key: str) -> Rule:
    return key, _is_number, "a number"


MAX_SEED = 2**32 - 1  # numpy's and Gymnasium's seed range

COMMON_RULES: list[Rule] = [
    positive_int("seed", minimum=0, maximum=MAX_SEED),
    ("seeds", lambda v: v is None or (isinstance(v, list) and len(v) > 0 and len(set(v)) == len(v)
                                      and all(_is_int(s) and 0 <= s <= MAX_SEED for s in v)),
     f"null (one seed, `seed`) or a list of distinct integers in [0, {MAX_SEED}] trained as one batch"),
    positive_int("total_steps"),
    one_of("device", ["cpu"]),
    positive_int("torch_threads"),
    positive_int("eval.every_steps"),
    positive_int("eval.episodes", maximum=10_000),
    boolean("eval.at_start"),
    boolean("logging.tensorboard"),
    boolean("logging.progress_bar"),
    boolean("logging.checkpoint"),
    positive_int("logging.checkpoint_every_steps"),
    name("env.name"),
    one_of("env.family", ["classic", "classic_continuous", "mujoco"]),
    ("env.id", lambda v: isinstance(v, str) and len(v) > 0, "a Gymnasium id string"),
    positive_int("env.total_steps"),
    positive_int("env.eval_every_steps"),
    positive_int("env.eval_episodes"),
    number("env.random_score"),
    ("env.reference_score", lambda v: v is None or _is_number(v), "null (left out of normalised scores) or a number"),
    positive_int("env.num_envs"),
    positive_int("env.num_steps"),
    boolean("env.normalize_obs"),
    boolean("env.scale_reward"),
    positive_number("env.obs_clip"),
    positive_number("env.reward_clip"),
    # conf/tuned/<family>.yaml: each preset's tuned values; each is range-checked where its preset reads it (algo.*).
    ("env.tuned", lambda v: isinstance(v, dict) and all(isinstance(block, dict) for block in v.values()),
     "a mapping: preset name -> its tuned values"),
]

PPO_RULES: list[Rule] = [
    name("algo.name"),
    ("algo.hidden_sizes", lambda v: isinstance(v, list) and len(v) > 0 and all(_is_int(x) and x > 0 for x in v),
     "a non-empty list of positive integers"),
    positive_number("algo.lr"),
    boolean("algo.anneal_lr"),
    positive_number("algo.adam_eps"),
    unit_interval("algo.gamma", low_open=True),
    unit_interval("algo.gae_lambda"),
    positive_int("algo.update_epochs"),
    positive_int("algo.num_minibatches"),
    positive_number("algo.clip_coef"),
    boolean("algo.clip_vloss"),
    boolean("algo.norm_adv"),
    non_negative_number("algo.ent_coef"),
    non_negative_number("algo.vf_coef"),
    positive_number("algo.max_grad_norm"),
    optional_positive_number("algo.target_kl"),
    one_of("algo.backend", ["torch", "numpy"]),
]


def optimizer_rules(prefix: str, lr_may_be_zero: bool) -> list[Rule]:
    """An Outer-PPO optimizer block (conf/algo/outer_ppo*.yaml: inner_optimizer, outer_optimizer)."""
    return [
        one_of(f"{prefix}.type", ["sgd", "adam", "adamw"]),
        non_negative_number(f"{prefix}.lr") if lr_may_be_zero else positive_number(f"{prefix}.lr"),
        (f"{prefix}.momentum", lambda v: _is_number(v) and 0 <= v < 1, "a number in [0, 1)"),
        boolean(f"{prefix}.nesterov"),
        (f"{prefix}.betas",
         lambda v: isinstance(v, list) and len(v) == 2 and all(_is_number(b) and 0 <= b < 1 for b in v),
         "a list of two numbers in [0, 1)"),
        positive_number(f"{prefix}.eps"),
        non_negative_number(f"{prefix}.weight_decay"),
        # momentum/nesterov are SGD's (adam/adamw: betas[0] is the momentum): checked so
        # that neither is ignored silently. (Nesterov with momentum 0 is plain SGD, allowed.)
        (prefix, _momentum_only_on_sgd, "momentum 0 and nesterov false unless type is sgd"),
    ]


def _momentum_only_on_sgd(block) -> bool:
    if not isinstance(block, dict):
        return False
    if block.get("type") == "sgd":
        return True
    return block.get("momentum") == 0 and block.get("nesterov") is False


# Outer-PPO (docs/algorithms.md section 3). The outer lr may be 0: the behaviour parameters then
# never move (a diagnostic setting and a test case), so it is allowed on purpose.
OUTER_PPO_RULES: list[Rule] = [
    name("algo.name"),
    *optimizer_rules("algo.inner_optimizer", lr_may_be_zero=False),
    *optimizer_rules("algo.outer_optimizer", lr_may_be_zero=True),
    boolean("algo.outer_optimizer.anneal_lr"),
    non_negative_number("algo.bias_coef"),
    one_of("algo.apply_to", ["all", "actor"]),
    one_of("algo.inner_loop", ["ppo", "full_batch"]),
    positive_int("algo.inner_epochs"),
]

# HP3O / HP3O+ (docs/algorithms.md section 4). k <= buffer_size and steps_per_batch >= k are
# checked in _hp3o_cross_checks (they relate two keys).
HP3O_RULES: list[Rule] = [
    positive_int("algo.buffer_size"),
    positive_int("algo.trajectories_per_batch"),
    positive_int("algo.steps_per_batch"),
    positive_int("algo.minibatch_size"),
    boolean("algo.recompute_advantages"),
    boolean("algo.best_baseline"),
    positive_number("algo.baseline_distance_threshold"),
]

# env.hparams: the task family's PPO defaults, which the algo presets interpolate
# (algo.lr: ${env.hparams.lr}); any subset of these keys, each in its algo.* range.
ENV_HPARAM_RULES: dict[str, Rule] = {
    key.removeprefix("algo."): (key.replace("algo.", "env.hparams.", 1), check, allowed)
    for key, check, allowed in PPO_RULES
    if key in ("algo.lr", "algo.gamma", "algo.gae_lambda", "algo.update_epochs", "algo.num_minibatches",
               "algo.ent_coef", "algo.vf_coef", "algo.clip_coef", "algo.max_grad_norm")
}

# Extra rules per algorithm kind (the `algorithm` key of a preset); PPO's apply to all.
ALGORITHM_RULES: dict[str, list[Rule]] = {"ppo": [], "outer_ppo": OUTER_PPO_RULES, "hp3o": HP3O_RULES}


def get_dotted(container: dict, dotted: str):
    """container['a']['b'] for 'a.b'; KeyError if a part is missing."""
    node = container
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def validate_config(cfg: DictConfig) -> None:
    """Raise ConfigError listing every invalid key, one line each."""
    try:
        data = OmegaConf.to_container(cfg, resolve=True)
    except Exception as error:  # an interpolation that cannot resolve
        raise ConfigError(f"config does not resolve: {error}") from None
    errors: list[str] = []

    kind = data.get("algo", {}).get("algorithm")
    if kind not in ALGORITHM_RULES:
        raise ConfigError(f"algo.algorithm must be one of {', '.join(sorted(ALGORITHM_RULES))} (got {kind!r})")

    for key, check, allowed in COMMON_RULES + PPO_RULES + ALGORITHM_RULES[kind]:
        try:
            value = get_dotted(data, key)
        except KeyError:
            errors.append(f"{key} is missing (must be {allowed})")
            continue
        if not check(value):
            errors.append(f"{key} must be {allowed}, got {value!r}")

    errors += _unknown_keys(data, COMMON_RULES + PPO_RULES + ALGORITHM_RULES[kind])

    hparams = data.get("env", {}).get("hparams", {})
    for hparam, value in (hparams.items() if isinstance(hparams, dict) else []):
        if hparam not in ENV_HPARAM_RULES:
            errors.append(f"env.hparams.{hparam} is not a task-family hyperparameter "
                          f"(known: {', '.join(ENV_HPARAM_RULES)})")
            continue
        key, check, allowed = ENV_HPARAM_RULES[hparam]
        if not check(value):
            errors.append(f"{key} must be {allowed}, got {value!r}")

    if not errors:
        errors += _cross_checks(data)
    if errors:
        raise ConfigError("\n".join(errors))


# Lookup tables an experiment config reads through interpolation (what they feed is checked where it lands).
HELPER_KEYS = {"ci_budget"}  # conf/experiment/regression_ci.yaml: per-task budget of the CI suite


def leaf_keys(node: dict, prefix: str = ""):
    """Dotted keys of every non-mapping value."""
    for key, value in node.items():
        if isinstance(value, dict):
            yield from leaf_keys(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def _unknown_keys(data: dict, rules: list[Rule]) -> list[str]:
    """A key no rule knows is a typo (`+algo.clip_coeff=0.1`) or belongs to no algorithm here: refused,
    never silently ignored. env.hparams.* and env.tuned.* are checked where they are read."""
    known = {key for key, _, _ in rules} | {"algo.algorithm", "env.hparams"} | HELPER_KEYS
    errors = []
    for key in leaf_keys(data):
        if not any(key == k or key.startswith(k + ".") for k in known):
            section = key.rsplit(".", 1)[0] if "." in key else None
            siblings = sorted(k.rsplit(".", 1)[1] for k in known if section and k.startswith(section + ".")
                              and k.count(".") == key.count("."))
            hint = f" (keys of {section}: {', '.join(siblings)})" if siblings else ""
            errors.append(f"{key} is not a key of this config: a typo, or a key of another algorithm{hint}")
    return errors


def _cross_checks(data: dict) -> list[str]:
    errors = []
    env, algo = data["env"], data["algo"]
    rollout = env["num_envs"] * env["num_steps"]
    if data["total_steps"] < rollout:
        errors.append(
            f"total_steps must be >= one rollout (env.num_envs * env.num_steps = {rollout}), got {data['total_steps']}"
        )
    if algo["algorithm"] in ("ppo", "outer_ppo") and rollout % algo["num_minibatches"] != 0:
        errors.append(
            f"algo.num_minibatches must divide the rollout size env.num_envs * env.num_steps = {rollout}, "
            f"got {algo['num_minibatches']}"
        )
    if algo["algorithm"] == "hp3o":
        errors += _hp3o_cross_checks(algo)
    if algo["backend"] == "numpy":
        errors += _numpy_backend_checks(algo["algorithm"])
    if data["seeds"] is not None:
        if algo["backend"] != "numpy":
            errors.append(f"seeds={data['seeds']} (one batched process) runs on algo.backend=numpy, "
                          f"got {algo['backend']!r}: add algo.backend=numpy")
        if algo["target_kl"] is not None:
            errors.append(f"algo.target_kl must be null with seeds=[...]: early stopping is per seed and the "
                          f"batch steps all seeds together (got {algo['target_kl']})")
    if env["reference_score"] is not None and env["reference_score"] <= env["random_score"]:
        errors.append(f"env.reference_score must be > env.random_score = {env['random_score']} (scores are "
                      f"normalised by their difference), got {env['reference_score']}")
    return errors


def _numpy_backend_checks(kind: str) -> list[str]:
    """algo.backend=numpy computes PPO's minibatch loss and its gradient by hand (algorithms/numpy_backend.py).
    An algorithm that changes that loss (overrides minibatch_step) would step on a gradient its own loss never
    wrote: refused here, before anything trains."""
    from algorithms import ALGORITHMS
    from algorithms.ppo import PPO

    algorithm = ALGORITHMS[kind]
    if algorithm.minibatch_step is not PPO.minibatch_step:
        return [f"algo.backend=numpy cannot run algo.algorithm={kind}: {algorithm.__name__} overrides "
                f"minibatch_step, whose gradient only the torch backend computes; use algo.backend=torch"]
    return []


def _hp3o_cross_checks(algo: dict) -> list[str]:
    errors = []
    k = algo["trajectories_per_batch"]
    if k > algo["buffer_size"]:
        errors.append(f"algo.trajectories_per_batch must be <= algo.buffer_size = {algo['buffer_size']}, got {k}")
    if algo["steps_per_batch"] < k:
        errors.append(f"algo.steps_per_batch must be >= algo.trajectories_per_batch = {k} (at least one step "
                      f"per trajectory), got {algo['steps_per_batch']}")
    return errors
