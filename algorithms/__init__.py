"""Algorithm registry: the `algorithm` key of a conf/algo preset -> class.

A shipped algorithm is named by its key here; a variant kept in a module of one's own by `module:Class`
(`algorithm: myvariants:PPOWithHuberValue`), imported when the config is checked, as a task's `id: module:Task` is.
"""

import dataclasses
import importlib
import inspect
import traceback

from algorithms.hp3o import HP3O
from algorithms.interface import Algorithm
from algorithms.outer_ppo import OuterPPO
from algorithms.ppo import PPO
from algorithms.ppo_kl import PPOKL
from algorithms.schema import rules_of_schema

ALGORITHMS = {"ppo": PPO, "outer_ppo": OuterPPO, "hp3o": HP3O, "ppo_kl": PPOKL}


def algorithm_class(kind) -> type:
    """The class algo.algorithm names: a key of ALGORITHMS, or `module:Class` for a class of a module of one's own.
    Raises ValueError in one line where it names none."""
    if isinstance(kind, str) and kind in ALGORITHMS:
        return ALGORITHMS[kind]
    if not isinstance(kind, str) or kind.count(":") != 1 or not all(kind.split(":")):
        raise ValueError(f"algo.algorithm must be one of {', '.join(sorted(ALGORITHMS))} or module:Class (a class of "
                         f"a module of one's own), got {kind!r}")
    module_name, class_name = kind.split(":")
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as error:  # a missing module, or one that fails (or exits) as it is imported
        frame = traceback.extract_tb(error.__traceback__)[-1]
        where = "" if frame.filename.startswith("<frozen") else f" at {frame.filename}:{frame.lineno}"
        raise ValueError(f"algo.algorithm={kind}: its module {module_name} cannot be imported "
                         f"({type(error).__name__}{where}: {error})") from None
    found = getattr(module, class_name, None)
    if found is None:
        raise ValueError(f"algo.algorithm={kind}: module {module_name} has no {class_name}")
    if not (isinstance(found, type) and issubclass(found, Algorithm)):
        raise ValueError(f"algo.algorithm={kind}: {module_name}.{class_name} is {found!r}, not a class of the "
                         f"algorithm interface (algorithms.interface.Algorithm: PPO and its subclasses are)")
    if inspect.isabstract(found):
        raise ValueError(f"algo.algorithm={kind}: {module_name}.{class_name} leaves methods of the algorithm interface "
                         f"abstract: {', '.join(sorted(found.__abstractmethods__))} (PPO implements them all)")
    if not dataclasses.is_dataclass(getattr(found, "Config", None)):
        raise ValueError(f"algo.algorithm={kind}: {module_name}.{class_name} declares no Config, the dataclass schema "
                         f"of its algo.* keys (PPO's subclasses inherit PPOConfig)")
    try:  # every key of its schema carries its check
        rules_of_schema(found.Config, "algo")
    except TypeError as error:
        raise ValueError(f"algo.algorithm={kind}: the Config of {module_name}.{class_name}: {error}") from None
    return found


def build_algorithm(kind: str, obs_dim: int, action_dim: int, discrete: bool, cfg, num_iterations: int,
                    network: dict | None = None):
    """network: the task's policy network (env.network), None for the MLP of algo.hidden_sizes."""
    arguments = (obs_dim, action_dim, discrete, cfg, num_iterations)
    algorithm = algorithm_class(kind)
    # passed only when a task asks for another network: an algorithm written for MLP tasks needs no network argument
    return algorithm(*arguments) if network is None else algorithm(*arguments, network=network)
