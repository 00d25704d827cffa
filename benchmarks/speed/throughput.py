"""Training throughput of this suite's algorithms side by side with Stable-Baselines3 PPO.

    python -m benchmarks.speed.throughput                      # PPO vs SB3: HalfCheetah 1 env, CartPole
    python -m benchmarks.speed.throughput --repeats 3 --steps 20480 --cases HalfCheetah-1env HalfCheetah-8env CartPole
    python -m benchmarks.speed.throughput --algos ppo outer_ppo hp3o --no-sb3
    python -m benchmarks.speed.throughput --backends torch compiled # also the population engine, one seed

Same env, rollout, epochs, minibatch size, network, normalisation and 1 torch
thread for both. SPS = env steps / training time; for this suite the
training time is the sum of the logged rollout and update times (evaluation and
start-up excluded), for SB3 the wall time of model.learn(). Runs alternate
(ours, SB3, ours, SB3, ...) so that machine noise hits both alike; the ratio of
medians is printed. Stable-Baselines3 is a benchmark-only dependency
(`pip install -e .[bench]`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

from benchmarks.engine.config import compose_config
from benchmarks.engine.trainer import train
from benchmarks.arguments import conf_name

# case name -> (env config, overrides that define the rollout)
CASES = {
    "HalfCheetah-1env": ("HalfCheetah", []),
    "HalfCheetah-8env": ("HalfCheetah", ["env.num_envs=8", "env.num_steps=256"]),
    "CartPole": ("CartPole", []),
}


# The speed tools measure each family's values before tuning, whatever the tuned defaults are, so that their
# tables stay comparable with each other over time (SB3 is given the same values): CleanRL's recipes - MuJoCo
# 10 epochs x 32 minibatches, lr 3e-4; discrete classic control 4 x 4, lr 2.5e-4 - and, for continuous classic
# control, the continuous recipe at lr 1e-3 (conf/env_family/classic_continuous.yaml).
RECIPE = {"mujoco": ["+tuning=mujoco_shipped"], "classic": ["env_family/values@env=shipped"],
          "classic_continuous": ["env_family/values@env=shipped"]}


def benchmark_config(env: str, algo: str, overrides: list[str], steps: int, backend: str = "torch",
                     recipe: bool = True):
    """recipe: the family's values before tuning (RECIPE); False: the tuned defaults a bare command runs."""
    family = compose_config([f"env={env}"]).env.family
    if family not in RECIPE:
        raise SystemExit(f"error: the speed tools measure MuJoCo and classic-control tasks; {env} is a "
                         f"{family} task")
    return compose_config([
        f"env={env}", *(RECIPE.get(family, []) if recipe else []), f"algo={algo}", f"algo.backend={backend}", f"total_steps={steps}",
        *overrides,
        "eval.at_start=false", f"eval.every_steps={10 * steps}", "eval.episodes=1",
        "logging.tensorboard=false", "logging.progress_bar=false", "logging.checkpoint=false",
    ])


def timed_sps(run_dirs: list[Path]) -> tuple[float, float]:
    """(env steps of all runs / the training time (rollout + update) of the batch (the same for every seed),
    the update's share of that time)."""
    log = pd.read_csv(run_dirs[0] / "train.csv")
    if len(log) < 2:
        raise SystemExit("error: give --steps of at least two iterations (the first, which compiles, is not timed)")
    per_iteration = int(log["env_steps"].iloc[0])
    log = log.iloc[1:]  # the first iteration compiles: left out for every configuration
    training_time = log["rollout_time"].sum() + log["update_time"].sum()
    return len(run_dirs) * per_iteration * len(log) / training_time, log["update_time"].sum() / training_time


def ours_sps(cfg) -> float:
    with tempfile.TemporaryDirectory() as run_dir:
        train(cfg, Path(run_dir))
        if cfg.algo.backend == "compiled":  # its first iteration compiles (seconds): left out
            return timed_sps([Path(run_dir)])[0]
        log = pd.read_csv(Path(run_dir) / "train.csv")
    return log["env_steps"].iloc[-1] / (log["rollout_time"].sum() + log["update_time"].sum())


def sb3_model(cfg):
    """Stable-Baselines3 PPO with the hyperparameters of `cfg` (env rollout, PPO's algo block)."""
    from stable_baselines3 import PPO as SB3PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    env_cfg, algo = cfg.env, cfg.algo
    venv = make_vec_env(env_cfg.id, n_envs=env_cfg.num_envs, seed=cfg.seed)
    if env_cfg.normalize_obs or env_cfg.scale_reward:
        venv = VecNormalize(venv, norm_obs=env_cfg.normalize_obs, norm_reward=env_cfg.scale_reward,
                            clip_obs=env_cfg.obs_clip, clip_reward=env_cfg.reward_clip, gamma=algo.gamma)
    rollout = env_cfg.num_envs * env_cfg.num_steps
    initial_lr = algo.lr
    return SB3PPO(
        "MlpPolicy", venv,
        learning_rate=(lambda remaining: initial_lr * remaining) if algo.anneal_lr else initial_lr,
        n_steps=env_cfg.num_steps, batch_size=rollout // algo.num_minibatches, n_epochs=algo.update_epochs,
        gamma=algo.gamma, gae_lambda=algo.gae_lambda, clip_range=algo.clip_coef, ent_coef=algo.ent_coef,
        vf_coef=algo.vf_coef, max_grad_norm=algo.max_grad_norm,
        policy_kwargs=dict(net_arch=dict(pi=list(algo.hidden_sizes), vf=list(algo.hidden_sizes)),
                           activation_fn=torch.nn.Tanh, optimizer_kwargs=dict(eps=algo.adam_eps)),
        device="cpu", seed=cfg.seed, verbose=0,
    )


def sb3_sps(cfg) -> float:
    model = sb3_model(cfg)
    start = time.perf_counter()
    model.learn(total_timesteps=cfg.total_steps)
    elapsed = time.perf_counter() - start
    model.get_env().close()
    return model.num_timesteps / elapsed


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=["HalfCheetah-1env", "CartPole"], choices=sorted(CASES))
    parser.add_argument("--algos", nargs="+", default=["ppo"], type=conf_name("algo"), help="conf/algo presets of this suite")
    parser.add_argument("--steps", type=int, default=20480, help="env steps per measured run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backends", nargs="+", default=["torch"], choices=["torch", "compiled"],
                        help="algo.backend values to measure each algo with; other rows than torch are named "
                             "algo[backend]; compiled runs leave their first iteration (it compiles) out")
    parser.add_argument("--no-sb3", action="store_true", help="skip Stable-Baselines3")
    args, started, load_before = parse_timing_args(parser, argv)

    rows = []
    for case in args.cases:
        env, overrides = CASES[case]
        samples: dict[str, list[float]] = {}
        for _ in range(args.repeats):
            for algo in args.algos:
                for backend in args.backends:
                    name = algo if backend == "torch" else f"{algo}[{backend}]"
                    cfg = benchmark_config(env, algo, overrides, args.steps, backend)
                    samples.setdefault(name, []).append(ours_sps(cfg))
            if not args.no_sb3:
                samples.setdefault("sb3_ppo", []).append(sb3_sps(benchmark_config(env, "ppo", overrides, args.steps)))
        medians = {name: statistics.median(values) for name, values in samples.items()}
        for name, values in samples.items():
            row = {"case": case, "impl": name, "median_sps": round(medians[name]),
                   "runs": " ".join(f"{v:.0f}" for v in values),
                   "vs_ppo_time_per_step": round(medians["ppo"] / medians[name], 3) if "ppo" in medians else None}
            if "sb3_ppo" in medians:
                row["ratio_vs_sb3"] = round(medians[name] / medians["sb3_ppo"], 2)
            rows.append(row)
        print(pd.DataFrame([r for r in rows if r["case"] == case]).to_string(index=False), flush=True)
    table = print_table(rows, f"steps per run: {args.steps}, repeats: {args.repeats}, torch threads: 1")
    if args.out:
        write_timing_table(
            args.out, "Training throughput", "benchmarks.speed.throughput", argv, started, load_before,
            "the runs themselves load one core", "SPS = env steps / (rollout + update time) for this suite, env "
            "steps / wall time of `model.learn()` for SB3; runs alternate, so the ratios of medians compare "
            "implementations under the same machine conditions. `vs_ppo_time_per_step` = wall time per env step "
            "relative to `ppo` (torch backend); `algo[compiled]` = "
            "`algo.backend=compiled` (a population of one; its first iteration, which compiles, left out).", table)


def parse_timing_args(parser: argparse.ArgumentParser, argv: list[str] | None):
    """A speed tool's arguments, with --out; then one torch thread and the clock started: (args, started, load
    before) for write_timing_table."""
    parser.add_argument("--out", type=Path, help="also write the table, with this command, to a Markdown file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    return args, time.strftime("%Y-%m-%d %H:%M"), os.getloadavg()[0]


def print_table(rows: list[dict], settings: str) -> str:
    """Print a speed tool's rows under a line of its settings; the table as Markdown (as text without tabulate)."""
    frame = pd.DataFrame(rows)
    table = frame.to_markdown(index=False) if _has_tabulate() else frame.to_string(index=False)
    print(f"\n{settings}\n{table}")
    return table


def write_timing_table(out: Path, title: str, module: str, argv: list[str] | None, started: str, load_before: float,
                       load_note: str | None, explanation: str, table: str, kernels_of_this_process: bool = True) -> None:
    """A timing table as markdown, with the exact command, when it ran, the float kernels it ran on (unless its
    runs are child processes of their own kernel mode) and how loaded the machine was."""
    from benchmarks import numerics

    command = f"python -m {module} " + " ".join(sys.argv[1:] if argv is None else argv)
    if kernels_of_this_process and numerics.MODE == "native":  # the kernels change the speed (numerics_cost.md)
        command = "SUITE_NUMERICS=native " + command
    load = f"1-minute load average {load_before:.2f} before and {os.getloadavg()[0]:.2f} after"
    record = numerics.kernel_record()
    kernels = (f"{numerics.MODE} numerics: torch {record['torch_cpu_capability']}, OpenBLAS {record['openblas_core']}, "
               if kernels_of_this_process else "")
    out.write_text(f"# {title}\n\nMade by `{command}` ({started} to {time.strftime('%H:%M')}, {os.cpu_count()} "
                   f"cores, {kernels}{load}{'; ' + load_note if load_note else ''}). {explanation}\n\n{table}\n")
    print(f"wrote {out}")


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
