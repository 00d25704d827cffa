"""Algorithm registry: the `algorithm` key of a conf/algo preset -> class."""

from algorithms.hp3o import HP3O
from algorithms.outer_ppo import OuterPPO
from algorithms.ppo import PPO
from algorithms.ppo_kl import PPOKL

ALGORITHMS = {"ppo": PPO, "outer_ppo": OuterPPO, "hp3o": HP3O, "ppo_kl": PPOKL}


def build_algorithm(kind: str, obs_dim: int, action_dim: int, discrete: bool, cfg, num_iterations: int,
                    network: dict | None = None):
    """network: the task's policy network (env.network), None for the MLP of algo.hidden_sizes."""
    if kind not in ALGORITHMS:
        raise ValueError(f"algo.algorithm must be one of {sorted(ALGORITHMS)} (got {kind!r})")
    arguments = (obs_dim, action_dim, discrete, cfg, num_iterations)
    # passed only when a task asks for another network: an algorithm written for MLP tasks needs no network argument
    return ALGORITHMS[kind](*arguments) if network is None else ALGORITHMS[kind](*arguments, network=network)
