"""The config schema: dataclasses whose fields are the keys, each annotated with its type and allowed range.

Each algorithm declares the schema of its own algo.* keys beside its code (`Config`, a class
attribute: a dataclass; a variant's dataclass subclasses its parent's and adds its keys), and
its checks that relate two keys (`check_config`). The keys every run has (seed, budget, eval,
logging, the task) are declared in benchmarks/engine/validate.py the same way, which checks a
composed config against them once, after interpolation, before any environment exists: every
failure is one line naming the key and its range. An algorithm reads its keys as attributes of
its Config, built once from the resolved config (`build`): typed, and without OmegaConf's cost
of resolving an interpolation on every read in the hot loop.

A key's annotation carries its check: `lr: PositiveFloat` (an alias below, `Annotated[float,
positive_number()]`), or `apply_to: Annotated[str, one_of(["all", "actor"])]` written out; a key added
after runs were stored adds `Before(<the value it had, in effect, in those runs>)`. A field whose type is
a dataclass is a nested schema.

A nested schema (an optimizer block) may declare a check of the whole block, `block_check`, a class
variable that rules_of_schema adds after the block's keys.

Why not Hydra's own schema mechanism (a dataclass in its ConfigStore): Hydra checks types while
it composes, before interpolations resolve, and says so in several lines; this checks the values
a run will use, one line each.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Callable, ClassVar


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    """A finite int or float (inf and nan are refused wherever a number is read)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Check:
    """What a key's value must be: a test, and the allowed range in words (for the one-line error)."""
    test: Callable[[Any], bool]
    allowed: str


# A rule of the validator: (dotted key, test, allowed-range text), derived from a schema (rules_of_schema).
Rule = tuple[str, Callable[[Any], bool], str]


def positive_int(minimum: int = 1, maximum: int | None = None) -> Check:
    if maximum is None:
        return Check(lambda v: is_int(v) and v >= minimum, f"an integer >= {minimum}")
    return Check(lambda v: is_int(v) and minimum <= v <= maximum, f"an integer in [{minimum}, {maximum}]")


def positive_number() -> Check:
    return Check(lambda v: is_number(v) and v > 0, "a number > 0")


def non_negative_number() -> Check:
    return Check(lambda v: is_number(v) and v >= 0, "a number >= 0")


def unit_interval(low_open: bool = False) -> Check:
    text = "a number in (0, 1]" if low_open else "a number in [0, 1]"
    return Check(lambda v: is_number(v) and (v > 0 if low_open else v >= 0) and v <= 1, text)


def number_between(low: float, high: float) -> Check:
    """A number in the open interval (low, high)."""
    return Check(lambda v: is_number(v) and low < v < high, f"a number in ({low:g}, {high:g})")


def boolean() -> Check:
    return Check(lambda v: isinstance(v, bool), "true or false")


def optional_positive_number() -> Check:
    return Check(lambda v: v is None or (is_number(v) and v > 0), "null or a number > 0")


def one_of(options) -> Check:
    return Check(lambda v: v in options, "one of " + ", ".join(map(str, options)))


def valid_name() -> Check:
    return Check(lambda v: isinstance(v, str) and len(v) > 0 and "/" not in v, "a non-empty name without '/'")


def number() -> Check:
    return Check(is_number, "a number")


def positive_int_list() -> Check:
    return Check(lambda v: isinstance(v, list) and len(v) > 0 and all(is_int(x) and x > 0 for x in v),
                 "a non-empty list of positive integers")


def mapping_of_mappings(what: str) -> Check:
    return Check(lambda v: isinstance(v, dict) and all(isinstance(block, dict) for block in v.values()), what)


@dataclass(frozen=True)
class Before:
    """In a key's annotation: the key was added after runs were stored, and `value` is what it had, in effect,
    in those runs (benchmarks/engine/config.py with_later_keys fills it into their configs, so that they
    compare key by key with today's and retrain as they ran)."""
    value: Any


# The checks most keys share, as types: `update_epochs: PositiveInt`.
PositiveInt = Annotated[int, positive_int()]
PositiveFloat = Annotated[float, positive_number()]
NonNegativeFloat = Annotated[float, non_negative_number()]
Flag = Annotated[bool, boolean()]
Name = Annotated[str, valid_name()]


@functools.cache
def type_hints(schema: type) -> dict[str, Any]:
    return typing.get_type_hints(schema, include_extras=True)


def nested_schema(schema: type, field: dataclasses.Field) -> type | None:
    """The dataclass a field holds, if it holds one."""
    hint = type_hints(schema)[field.name]
    return hint if dataclasses.is_dataclass(hint) else None


def annotations_of(schema: type, field: dataclasses.Field) -> tuple:
    """What a key's annotation carries beside its type: its Check, and Before where it has one."""
    hint = type_hints(schema)[field.name]
    extras = getattr(hint, "__metadata__", ())
    if not any(isinstance(extra, Check) for extra in extras):
        checked = {float: "NonNegativeFloat", int: "PositiveInt", bool: "Flag", str: "Name"}.get(hint)
        default = "" if field.default is dataclasses.MISSING else f" = {field.default!r}"
        example = f"`{field.name}: {checked}{default}`" if checked else f"`{field.name}: Annotated[<type>, <check>]`"
        raise TypeError(f"{schema.__name__}.{field.name}: a schema key is annotated with its check "
                        f"(Annotated[type, Check]) or is a nested schema (a dataclass), got {hint!r}: e.g. "
                        f"{example} (algorithms/schema.py holds such types and the checks)")
    return extras


def check_of(schema: type, field: dataclasses.Field) -> Check:
    return next(extra for extra in annotations_of(schema, field) if isinstance(extra, Check))


def before_of(schema: type, field: dataclasses.Field) -> Before | None:
    return next((extra for extra in annotations_of(schema, field) if isinstance(extra, Before)), None)


def rules_of_schema(schema: type, prefix: str) -> list[Rule]:
    """Every rule of a schema dataclass, keys dotted under prefix, nested schemas included (with their
    whole-block check, `block_check`, after their keys')."""
    rules: list[Rule] = []
    for field in dataclasses.fields(schema):
        dotted = f"{prefix}.{field.name}" if prefix else field.name
        inner = nested_schema(schema, field)
        if inner is not None:
            rules += rules_of_schema(inner, dotted)
            block_check = getattr(inner, "block_check", None)
            if block_check is not None:
                rules.append((dotted, block_check.test, block_check.allowed))
        else:
            check = check_of(schema, field)
            rules.append((dotted, check.test, check.allowed))
    return rules


def values_before(schema: type) -> dict[str, Any]:
    """{key: the value runs used before it existed} for every key of the schema that declares one, nested
    schemas as nested mappings (a block with none is left out)."""
    values = {}
    for field in dataclasses.fields(schema):
        inner = nested_schema(schema, field)
        if inner is not None:
            if inner_values := values_before(inner):
                values[field.name] = inner_values
        elif (before := before_of(schema, field)) is not None:
            values[field.name] = before.value
    return values


def fill_missing(config: dict, values: dict) -> dict:
    """config with each of `values`' keys it lacks (nested mappings merged key by key), as a new mapping."""
    filled = dict(config)
    for name, value in values.items():
        if isinstance(value, dict) and isinstance(filled.get(name), dict):
            filled[name] = fill_missing(filled[name], value)
        elif name not in filled:
            filled[name] = value
    return filled


def build(schema: type, values: dict):
    """The schema's dataclass holding a resolved config's values (nested ones as their dataclasses).
    Values are taken as they are: the validator has checked them."""
    arguments = {}
    for field in dataclasses.fields(schema):
        if field.name not in values:
            raise KeyError(f"the config lacks the key {field.name!r} of {schema.__name__}")
        inner = nested_schema(schema, field)
        arguments[field.name] = build(inner, values[field.name]) if inner is not None else values[field.name]
    return schema(**arguments)


def build_config(schema: type, cfg):
    """An algo config as its schema's dataclass: a dict, or any mapping (an OmegaConf DictConfig resolves its
    interpolations as it is read), turned into plain dicts and lists here once."""
    return build(schema, plain(cfg))


def plain(value):
    """Mappings and sequences (OmegaConf's containers among them, without importing it) as dicts and lists."""
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [plain(item) for item in value]
    return value


# -- the optimizer blocks (conf/optimizer/: sgd, adam, adamw), Outer-PPO's inner and outer optimizers ----------


def momentum_only_on_sgd(block) -> bool:
    if not isinstance(block, dict):
        return False
    if block.get("type") == "sgd":
        return True
    return block.get("momentum") == 0 and block.get("nesterov") is False


MOMENTUM = Check(lambda v: is_number(v) and 0 <= v < 1, "a number in [0, 1)")
ADAM_BETAS = Check(lambda v: isinstance(v, list) and len(v) == 2 and all(is_number(b) and 0 <= b < 1 for b in v),
                   "a list of two numbers in [0, 1)")


@dataclass
class OptimizerConfig:
    """An optimizer block. Every block has the same keys whatever its type (momentum and nesterov are
    SGD's, betas and eps Adam's), so stored runs compare key by key."""
    type: Annotated[str, one_of(["sgd", "adam", "adamw"])]
    lr: PositiveFloat
    momentum: Annotated[float, MOMENTUM]
    nesterov: Flag
    betas: Annotated[list[float], ADAM_BETAS]
    eps: PositiveFloat
    weight_decay: NonNegativeFloat
    # momentum/nesterov are SGD's (adam/adamw: betas[0] is the momentum): checked so that neither is
    # ignored silently. (Nesterov with momentum 0 is plain SGD, allowed.)
    block_check: ClassVar[Check | None] = Check(momentum_only_on_sgd,
                                                "momentum 0 and nesterov false unless type is sgd")


@dataclass
class OuterOptimizerConfig(OptimizerConfig):
    """Outer-PPO's outer step: its lr may be 0 (the behaviour parameters then never move: a diagnostic
    setting and a test case, allowed on purpose), and its lr may follow PPO's schedule."""
    lr: NonNegativeFloat
    anneal_lr: Flag
    # The effective outer step sigma_eff = |theta_{k+1} - theta_k| / |g_k| (PPO's own step is 1). null: the
    # optimizer's lr decides it. A number: every iteration the optimizer's step is rescaled to that norm (the lr
    # that gives it; the step of SGD and Adam(W) is linear in the lr), so lr must stay 1.0.
    sigma_eff: Annotated[float | None, optional_positive_number(), Before(None)]
