"""The building blocks of the config schema: a rule per key (key, check, allowed-range text).

Each algorithm declares the rules of its own algo.* keys beside its code (`config_rules`, a
class attribute; a subclass adds to its parent's), and its checks that relate two keys
(`check_config`). benchmarks/engine/validate.py applies them, with the rules of the keys every run
has, before any environment exists; every failure is one line naming the key and the range.
"""

from __future__ import annotations

import math
from typing import Any, Callable


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    """A finite int or float (inf and nan are refused wherever a number is read)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# A rule: (key, check(value) -> bool, allowed-range text)
Rule = tuple[str, Callable[[Any], bool], str]


def positive_int(key: str, minimum: int = 1, maximum: int | None = None) -> Rule:
    if maximum is None:
        return key, lambda v: is_int(v) and v >= minimum, f"an integer >= {minimum}"
    return key, lambda v: is_int(v) and minimum <= v <= maximum, f"an integer in [{minimum}, {maximum}]"


def positive_number(key: str) -> Rule:
    return key, lambda v: is_number(v) and v > 0, "a number > 0"


def non_negative_number(key: str) -> Rule:
    return key, lambda v: is_number(v) and v >= 0, "a number >= 0"


def unit_interval(key: str, low_open: bool = False) -> Rule:
    text = "a number in (0, 1]" if low_open else "a number in [0, 1]"
    return key, lambda v: is_number(v) and (v > 0 if low_open else v >= 0) and v <= 1, text


def number_between(key: str, low: float, high: float) -> Rule:
    """A number in the open interval (low, high)."""
    return key, lambda v: is_number(v) and low < v < high, f"a number in ({low:g}, {high:g})"


def boolean(key: str) -> Rule:
    return key, lambda v: isinstance(v, bool), "true or false"


def optional_positive_number(key: str) -> Rule:
    return key, lambda v: v is None or (is_number(v) and v > 0), "null or a number > 0"


def one_of(key: str, options) -> Rule:
    return key, lambda v: v in options, "one of " + ", ".join(map(str, options))


def name(key: str) -> Rule:
    return key, lambda v: isinstance(v, str) and len(v) > 0 and "/" not in v, "a non-empty name without '/'"


def number(key: str) -> Rule:
    return key, is_number, "a number"


def optimizer_rules(prefix: str, lr_may_be_zero: bool) -> list[Rule]:
    """An Outer-PPO optimizer block (conf/algo/outer_ppo*.yaml: inner_optimizer, outer_optimizer)."""
    return [
        one_of(f"{prefix}.type", ["sgd", "adam", "adamw"]),
        non_negative_number(f"{prefix}.lr") if lr_may_be_zero else positive_number(f"{prefix}.lr"),
        (f"{prefix}.momentum", lambda v: is_number(v) and 0 <= v < 1, "a number in [0, 1)"),
        boolean(f"{prefix}.nesterov"),
        (f"{prefix}.betas",
         lambda v: isinstance(v, list) and len(v) == 2 and all(is_number(b) and 0 <= b < 1 for b in v),
         "a list of two numbers in [0, 1)"),
        positive_number(f"{prefix}.eps"),
        non_negative_number(f"{prefix}.weight_decay"),
        # momentum/nesterov are SGD's (adam/adamw: betas[0] is the momentum): checked so
        # that neither is ignored silently. (Nesterov with momentum 0 is plain SGD, allowed.)
        (prefix, momentum_only_on_sgd, "momentum 0 and nesterov false unless type is sgd"),
    ]


def momentum_only_on_sgd(block) -> bool:
    if not isinstance(block, dict):
        return False
    if block.get("type") == "sgd":
        return True
    return block.get("momentum") == 0 and block.get("nesterov") is False


def rules_of(algorithm_class) -> list[Rule]:
    """Every rule of an algorithm class: its ancestors' config_rules first, then its own."""
    rules: list[Rule] = []
    for klass in reversed(algorithm_class.__mro__):
        rules += klass.__dict__.get("config_rules", [])
    return rules
