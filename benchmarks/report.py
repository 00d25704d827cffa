"""Stored runs -> result tables and plots. Never trains.

    python -m benchmarks.report                         # every suite under results/runs, into results/
    python -m benchmarks.report /tmp/my_sweep           # your own sweep: into /tmp/my_sweep/report/
    python -m benchmarks.report /tmp/my_sweep --out somewhere

For each suite directory (a sweep's hydra.sweep.dir) it writes
    <out>/tables/<suite>.md and .csv     per (task, algorithm): seeds, budget, final return mean,
                                         95% bootstrap CI, IQM, AUC, CleanRL's last-100 metric,
                                         wall time per env step (absolute and relative to PPO),
                                         probability of improvement over PPO with 95% CI
    <out>/plots/<suite>_<task>.png/.svg  eval return vs env steps (generated tokens on token tasks), one line per algorithm,
                                         mean over seeds with a 95% bootstrap confidence band (none for one seed;
                                         the title marks n < 5 unreliable); a saturated task is flagged
    <out>/plots/<suite>_<task>_vs_ppo.*  the same, one small panel per variant with PPO in each
                                         (shared y-axis); presets with at least 5 seeds only
    <out>/tables/<suite>_aggregate.*     across tasks (a suite of at least 2 tasks and 5 seeds each), on
                                         scores normalised per task from a uniform-random policy (0,
                                         conf/env's random_score) to the best evaluation any run of the
                                         suite reached (1): rliable's IQM and mean with stratified-bootstrap
                                         CIs, P(improve over PPO); saturated tasks flagged
    <out>/plots/<suite>_aggregate.png    the aggregate table as rliable's figure set: IQM, mean,
                                         P(improve over PPO) with 95% CIs, and the performance profile
    <out>/plots/<suite>_sample_efficiency.png  rliable's IQM sample-efficiency curves: IQM of normalised
                                         scores at each evaluation, with 95% stratified-bootstrap CIs
    <out>/plots/<suite>_<task>_sensitivity.*  Outer-PPO sigma x mu heatmap (sensitivity sweeps), cells at the
                                         ceiling marked
    <out>/plots/<suite>_<task>_kl_frontier.png  token tasks: reward and judge against KL to the reference (one
                                         panel where the reward is the judge)
    results/figures.md                   (no arguments) every figure with what it reads
Suites are reported --jobs at a time (default: every core), a progress line each. With no arguments, a
suite whose runs and report code are those recorded in results/report_stamps.json is kept as it is
(--force remakes it).
Statistics use fixed random states, so the tables regenerate byte-identically.
The probability of improvement and its stratified-bootstrap CI come from
rliable (Agarwal et al. 2021); CIs of per-task means are percentile bootstraps
over seeds.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import zlib
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.engine.logger import read_csv_complete_rows
from benchmarks.arguments import existing_file, suite_directory
from benchmarks.runs import (CONF_ENV, eval_curves, group_runs, last_episodes_mean, left_out_lines, load_runs,
                            mixed_configurations, unequal_budgets)
from benchmarks.statistics import (
    BOOTSTRAP_RESAMPLES,
    MIN_SEEDS_FOR_CI,
    area_under_curve,
    bootstrap_mean_ci,
    interquartile_mean,
    per_preset_estimates,
    probability_of_improvement,
    trimmed_means,
)

RESULTS = Path(__file__).resolve().parents[1] / "results"


def wall_time_per_step(run: dict) -> float:
    """Training seconds per env step (rollout + update; evaluation excluded). A population's seed logs the times of
    the loop it shares with the seeds trained with it: its share is that over their number (what one seed's step
    cost, as summarize's cpu_hours counts it)."""
    train_log = read_csv_complete_rows(run["dir"] / "train.csv")
    seconds = train_log["rollout_time"].sum() + train_log["update_time"].sum()
    return float(seconds / train_log["env_steps"].iloc[-1] / run.get("trained_together", 1))


def suite_table(runs: list[dict]) -> pd.DataFrame:
    grouped = group_runs(runs)
    curves_of = {key: eval_curves(group) for key, group in grouped.items()}
    saturated = {env: task_saturated([run for run in runs if run["env"] == env])
                 for env in dict.fromkeys(env for env, _ in grouped)}
    rows = []
    for (env, algo), group in grouped.items():
        curves = curves_of[(env, algo)]
        finals = curves.iloc[-1].to_numpy()
        aucs = np.array([area_under_curve(curves[seed]) for seed in curves.columns])
        low, high = bootstrap_mean_ci(finals)
        seconds_per_step = np.mean([wall_time_per_step(run) for run in group])
        row = {
            "task": env, "algo": algo, "seeds": len(group), "env_steps": int(curves.index[-1]),
            "final_mean": finals.mean(), "final_ci_low": low, "final_ci_high": high,
            "final_std": finals.std(), "final_iqm": interquartile_mean(finals),
            "auc_mean": aucs.mean(),
            "last100_train_mean": np.mean([last_episodes_mean(run) for run in group]),
            "us_per_step": 1e6 * seconds_per_step,
            # a task most of whose runs end at the best any run reached (figures flag it), and the presets whose
            # evaluation curves are this one's in every seed (their lines coincide)
            "saturated": saturated[env],
            "same_eval_as": " ".join(other for (other_env, other), other_curves in curves_of.items()
                                     if other_env == env and other != algo and curves.equals(other_curves)),
        }
        rows.append(row)
    table = pd.DataFrame(rows)
    # Relative to PPO on the same task: time per step and probability of improvement (final return).
    for index, row in table.iterrows():
        ppo = table[(table["task"] == row["task"]) & (table["algo"] == "ppo")]
        if ppo.empty:
            continue
        table.loc[index, "time_vs_ppo"] = row["us_per_step"] / ppo["us_per_step"].iloc[0]
        if row["algo"] == "ppo":
            continue
        if tuple(curves_of[(row["task"], row["algo"])].index) != tuple(curves_of[(row["task"], "ppo")].index):
            table.loc[index, "auc_note"] = "evaluated at other env steps than PPO"  # areas of other points
        if row["env_steps"] != ppo["env_steps"].iloc[0]:  # the protocol compares equal budgets only
            table.loc[index, "poi_vs_ppo_note"] = f"not compared: PPO trained {int(ppo['env_steps'].iloc[0]):,} env steps"
        else:
            candidate = curves_of[(row["task"], row["algo"])].iloc[-1].to_numpy()
            baseline = curves_of[(row["task"], "ppo")].iloc[-1].to_numpy()
            point, low, high = probability_of_improvement(candidate.reshape(-1, 1), baseline.reshape(-1, 1))
            table.loc[index, ["poi_vs_ppo", "poi_ci_low", "poi_ci_high"]] = [point, low, high]
    return table


def same_curves(group: list[dict], other: list[dict]) -> bool:
    """Whether two presets' runs evaluated the same seeds at the same steps with the same returns."""
    return eval_curves(group).equals(eval_curves(other))


def final_return_description(runs: list[dict]) -> str:
    """What a suite's final return is: the evaluation its runs' config names, at the end of training."""
    episodes = runs[0]["config"]["eval"]["episodes"]
    if is_token_task(runs):
        tasks = {run["config"]["env"]["name"]: run for run in runs}
        scores = "; ".join(f"{name}: the {axis_names([run])[1]}" for name, run in sorted(tasks.items()))
        return f"at the end of training, {episodes} prompts per seed ({scores})"
    return f"deterministic evaluation at the end of training ({episodes} episodes per seed)"


def task_decimals(table: pd.DataFrame) -> list[int]:
    """Decimals of each row's scores: three significant digits of its task's largest one, at least one decimal
    (2022.4 and -150.3 as before; 0.677 where a task scores in [0, 1], which one decimal read as 0.7 for 0.721).
    (The Markdown writer prints a column of bare numbers without trailing zeros: 0.010 as 0.01.)"""
    import math

    columns = [column for column in ("final_mean", "final_ci_low", "final_ci_high", "final_iqm", "auc_mean")
               if column in table]
    largest = table[columns].abs().max(axis=1).groupby(table["task"]).transform("max")
    return [max(1, 2 - math.floor(math.log10(value))) if np.isfinite(value) and value > 0 else 1 for value in largest]


def markdown(table: pd.DataFrame, suite: str, command: str, suite_path: str | None = None,
             final_return: str = "deterministic evaluation at the end of training (10 episodes per seed)") -> str:
    """The suite's table in Markdown under its header; command: what made it, as `made_by` writes it."""
    suite_path = suite_path or f"results/runs/{suite}"
    decimals = task_decimals(table)

    def scores(column: str) -> list[str]:
        return [f"{value:.{places}f}" for value, places in zip(table[column], decimals)]

    shown = pd.DataFrame({
        "task": table["task"], "algo": table["algo"],
        "seeds": table["seeds"].map(lambda n: f"{n}" if n >= MIN_SEEDS_FOR_CI else f"{n} (<{MIN_SEEDS_FOR_CI}: CIs unreliable)"),
        "env steps": table["env_steps"],
        "final return (mean [95% CI])": [f"{m} [{lo}, {hi}]" for m, lo, hi in
                                         zip(scores("final_mean"), scores("final_ci_low"), scores("final_ci_high"))],
        "final std": scores("final_std"),
        "final IQM": scores("final_iqm"),
        "AUC": [text if pd.isna(note) else f"{text} ({note})" for text, note in
                zip(scores("auc_mean"), table.get("auc_note", pd.Series(np.nan, index=table.index)))],
        "last-100 train": ["a seed ended no episode" if pd.isna(value) else text
                           for value, text in zip(table["last100_train_mean"], scores("last100_train_mean"))],
        "us/step": table["us_per_step"].map(lambda v: f"{v:.0f}"),
        "time vs PPO": table.get("time_vs_ppo", pd.Series(np.nan, index=table.index)).map(
            lambda v: "" if pd.isna(v) else f"{v:.2f}x"),
        "P(improve over PPO) [95% CI]": [
            (note if isinstance(note, str) else "") if pd.isna(p) else f"{p:.2f} [{lo:.2f}, {hi:.2f}]"
            for p, lo, hi, note in zip(table.get("poi_vs_ppo", pd.Series(np.nan, index=table.index)),
                                       table.get("poi_ci_low", pd.Series(np.nan, index=table.index)),
                                       table.get("poi_ci_high", pd.Series(np.nan, index=table.index)),
                                       table.get("poi_vs_ppo_note", pd.Series(np.nan, index=table.index)))],
    })
    header = (
        f"# {suite}\n\n"
        f"Made by {command}; table by `python -m benchmarks.report {suite_path}`.\n"
        f"Final return: {final_return}, mean over seeds "
        f"with a 95% percentile-bootstrap CI ({BOOTSTRAP_RESAMPLES} resamples); IQM over seeds; AUC = mean eval "
        f"return over training; last-100 train = CleanRL's metric (mean of the last 100 training episodes, "
        f"stochastic policy); us/step = training wall time per env step (evaluation excluded; a population's "
        f"shared among its seeds); "
        f"P(improve over PPO) = rliable's probability of improvement on the final return, stratified bootstrap CI. "
        f"With fewer than {MIN_SEEDS_FOR_CI} seeds a bootstrap CI is little more than the seeds' own range: such "
        f"rows are marked.\n\n"
    )
    return header + shown.to_markdown(index=False) + "\n"


def save_figure(fig, stem: Path, suffixes: tuple[str, ...] = (".png", ".svg"), dpi: int = 150) -> list[Path]:
    """PNG for reading, SVG for papers (no date stamp, so an unchanged figure stays byte-identical)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    paths = []
    for suffix in suffixes:
        path = stem.with_name(stem.name + suffix)
        if suffix == ".png":
            save_png_palette(fig, path, dpi)
        else:  # the canvas grows to hold every title, label and legend: nothing is clipped
            fig.savefig(path, dpi=dpi, metadata={"Date": None}, bbox_inches="tight", pad_inches=0.08)
        paths.append(path)
    plt.close(fig)
    return paths


def save_png_palette(fig, path: Path, dpi: int) -> None:
    """The PNG with a 256-colour palette: a plot of lines and bands on white needs no more, and the
    file is about 3x smaller than matplotlib's RGBA one (results/ is committed)."""
    import io

    from PIL import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight", pad_inches=0.08)
    buffer.seek(0)
    with Image.open(buffer) as image:
        image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


# One colour and marker per algorithm in every figure the suite makes (Paul Tol's colour-blind-safe
# "bright" scheme); PPO, the reference, is black. A preset not listed gets a style from SPARE_STYLES
# picked by a hash of its name: the same in every figure, whichever algorithms a figure holds.
ALGO_STYLE = {
    "ppo": ("#000000", "o"),
    "outer_ppo": ("#EE6677", "s"),
    "outer_ppo_lr": ("#4477AA", "^"),
    "outer_ppo_nesterov": ("#228833", "v"),
    "outer_ppo_biased": ("#CCBB44", "D"),
    "hp3o": ("#66CCEE", "P"),
    "hp3o_plus": ("#AA3377", "X"),
    "ppo_kl": ("#EE7733", "*"),  # Tol's "vibrant" orange
}


# Colours from Paul Tol's schemes that no ALGO_STYLE colour resembles (indigo, teal, olive), each with markers
# none of them uses: twelve styles, so that two presets of one's own seldom share one (three did, one in three).
SPARE_STYLES = [(colour, marker) for marker in ("h", "d", "p", "<") for colour in ("#332288", "#009988", "#999933")]


def algo_style(algo: str) -> tuple[str, str]:
    """(colour, marker) of a preset in every figure."""
    if algo in ALGO_STYLE:
        return ALGO_STYLE[algo]
    return SPARE_STYLES[zlib.crc32(algo.encode()) % len(SPARE_STYLES)]


def algo_color(algo: str) -> str:
    return algo_style(algo)[0]


def _format_steps(steps: float, _position) -> str:
    """An axis tick: 0.25k, 1k, 1.5M."""
    return f"{steps / 1e6:g}M" if steps >= 1e6 else f"{steps / 1e3:g}k" if steps else "0"


def steps_text(steps: int) -> str:
    """A budget in a title or note: short where that is round (300k, 2.5k, 1.5M), else every digit (2,048)."""
    if steps >= 1_000_000 and steps % 100_000 == 0:
        return f"{steps / 1e6:g}M"
    if 0 < steps < 1_000_000 and steps % 100 == 0:
        return f"{steps / 1e3:g}k"
    return f"{steps:,}"


def identical_to(task_runs: list[dict]) -> dict[str, str]:
    """algo -> the first preset (in drawing order) whose curve its curve is, seed for seed: drawn on top of it."""
    algos = sorted({run["algo"] for run in task_runs}, key=lambda a: (a != "ppo", a))
    groups = {algo: [run for run in task_runs if run["algo"] == algo] for algo in algos}
    same = {}
    for i, algo in enumerate(algos):
        twin = next((other for other in algos[:i] if other not in same and same_curves(groups[other], groups[algo])),
                    None)
        if twin is not None:
            same[algo] = twin
    return same


def figure_notes(task_runs: list[dict]) -> str:
    """What a title adds about its task's runs: hyperparameters tuned at another budget, saturation."""
    notes = [tuning_note(task_runs)]
    if task_saturated(task_runs):
        notes.append(saturation_note(task_runs[0]["env"], len(task_runs)))
    return "".join(f". {note[0].upper()}{note[1:]}" for note in notes if note)


def plot_suite(runs: list[dict], suite: str, plots_dir: Path) -> list[Path]:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    written = []
    for env in sorted({run["env"] for run in runs}):
        fig, ax = plt.subplots(figsize=(8.0, 4.2))
        task_runs = [run for run in runs if run["env"] == env]
        algos = sorted({run["algo"] for run in task_runs}, key=lambda a: (a != "ppo", a))
        twins, counts = identical_to(task_runs), []
        for algo in algos:
            group = [run for run in task_runs if run["algo"] == algo]
            curves = eval_curves(group)
            counts.append(curves.shape[1])
            mean = curves.mean(axis=1)
            color, marker = algo_style(algo)
            same = f", the same curve as {twins[algo]}" if algo in twins else ""
            line, = ax.plot(mean.index, mean.to_numpy(), label=f"{algo} ({seeds_label(curves.shape[1])}{same})",
                            color=color, marker=marker, markersize=3.5, linewidth=2.0 if algo == "ppo" else 1.4,
                            linestyle="--" if algo in twins else "-")
            if curves.shape[1] > 1:  # one seed has no band
                low, high = bootstrap_mean_ci(curves.to_numpy().T)
                ax.fill_between(mean.index, low, high, alpha=0.18, color=line.get_color(), linewidth=0)
        published = draw_published(ax, task_runs)
        x_label, y_label = axis_names(task_runs)
        ax.set_title(wrapped(f"{suite}: {env_title(task_runs)}, {budget_text(task_runs)} - {y_label} "
                             f"({band_note(counts)}){figure_notes(task_runs)}", 8.0), fontsize=9)
        ax.set_xlabel(x_label)
        ax.set_ylabel(y_label)
        ax.xaxis.set_major_formatter(FuncFormatter(_format_steps))
        ax.grid(alpha=0.3)
        if published:  # long labels: below the axes
            fig.set_figheight(4.2 + 0.25 * (len(algos) + 1.5 * published))
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, -0.14), frameon=False)
        else:
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        written += save_figure(fig, plots_dir / f"{suite}_{env}")
    return written


# Published results a figure can be checked against (task, algo, env steps, metric, mean, std, source).
PUBLISHED = RESULTS / "reference" / "published.csv"


def published_references(runs: list[dict]) -> list[dict]:
    """Published rows for these runs' task and algorithms at their budget (within one rollout of 2048 steps)."""
    if not PUBLISHED.exists() or not runs:
        return []
    table = pd.read_csv(PUBLISHED)
    env_steps = max(int(run["eval"]["env_steps"].iloc[-1]) for run in runs)
    algos = {run["algo"] for run in runs}
    rows = table[(table["task"] == runs[0]["env"]) & table["algo"].isin(algos)
                 & ((table["env_steps"] - env_steps).abs() <= 2048)]
    return rows.to_dict("records")


def draw_published(ax, runs: list[dict]) -> int:
    """Each published number at the same budget, beside the same metric measured on these runs.

    Published MuJoCo/CartPole numbers are CleanRL's metric (mean return of the last 100 training
    episodes), not the deterministic evaluation the curves show: both points are drawn at the end
    of the budget, labelled with their metric, so like is compared with like. Returns the legend entries added.
    """
    rows = published_references(runs)
    for row in rows:
        group = [run for run in runs if run["algo"] == row["algo"]]
        ours = np.array([last_episodes_mean(run) for run in group])
        x = max(int(run["eval"]["env_steps"].iloc[-1]) for run in group)
        color = algo_color(row["algo"])
        ax.errorbar([x * 1.015], [row["mean"]], yerr=[row["std"]], fmt="*", color="#777777", markersize=9,
                    capsize=3, label=f"{row['source']}, {row['gymnasium_id']}, {row['seeds']} seeds:\n"
                                     f"last-100 training episodes {row['mean']:.1f} +- {row['std']:.1f}")
        ax.errorbar([x * 1.03], [ours.mean()], yerr=[ours.std()], fmt="o", mfc="white", color=color, markersize=6,
                    capsize=3, label=f"{row['algo']} here ({plural(len(ours), 'seed')}), same metric: {ours.mean():.1f}"
                                     + (f" +- {ours.std():.1f}" if len(ours) > 1 else ""))
    return 2 * len(rows)




def seeds_label(count: int) -> str:
    """n per curve (a legend entry's; whether its band means much, the title says: band_note)."""
    return f"n={count}"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' * (count != 1)}"


def band_note(counts) -> str:
    """What a figure of mean curves with 95% bootstrap bands over seeds draws, for its title: a band only where a
    curve has two seeds or more, marked unreliable below MIN_SEEDS_FOR_CI."""
    counts = {int(n) for n in counts}
    if counts == {1}:
        return "one seed per curve, no band"
    note = "mean over seeds, 95% bootstrap band"
    if min(n for n in counts if n > 1) < MIN_SEEDS_FOR_CI:
        note += f", unreliable with fewer than {MIN_SEEDS_FOR_CI} seeds"
    return note + ("; a curve of one seed has none" if 1 in counts else "")


def tuning_steps(name: str) -> int | None:
    """The trial budget (env steps) of the study whose values conf/tuning/<name>.yaml holds (conf/tune/*.yaml,
    hydra.sweeper.values_file); None where no study wrote them."""
    from omegaconf import OmegaConf

    for path in sorted((CONF_ENV.parent / "tune").glob("*.yaml")):
        study = OmegaConf.load(path)
        values_file = OmegaConf.select(study, "hydra.sweeper.values_file")
        if values_file == f"conf/tuning/{name}.yaml" and "total_steps" in study:
            return int(study.total_steps)
    return None


def tuning_override(overrides: Path) -> str | None:
    """The +tuning=<name> a run's command line set (its .hydra/overrides.yaml), None where it set none."""
    from omegaconf import OmegaConf

    listed = list(OmegaConf.load(overrides)) if overrides.exists() else []
    return next((o.split("=", 1)[1] for o in listed if o.startswith("+tuning=")), None)


def run_tunings(runs: list[dict]) -> dict[str, str]:
    """algo -> the +tuning=<name> its runs' command lines set, where they all do."""
    named: dict[str, set] = {}
    for run in runs:
        named.setdefault(run["algo"], set()).add(
            tuning_override(Path(run["dir"]) / ".hydra" / "overrides.yaml") if "dir" in run else None)
    return {algo: names.pop() for algo, names in sorted(named.items()) if len(names) == 1 and None not in names}


def tuning_note(runs: list[dict]) -> str:
    """Where runs took hyperparameters tuned at another budget than theirs (+tuning=<name>), which and at what
    budget: a suite named after the tuning budget says which budget its name means."""
    total = max(run["config"]["total_steps"] for run in runs)
    tunings, notes = run_tunings(runs), []
    for name in sorted(set(tunings.values())):
        steps = tuning_steps(name)
        if steps is not None and steps != total:
            algos = sorted(algo for algo, tuning in tunings.items() if tuning == name)
            whose = "" if len(algos) == len({run["algo"] for run in runs}) else f" ({', '.join(algos)})"
            notes.append(f"hyperparameters{whose} +tuning={name}, tuned on {steps_text(steps)}-step trials")
    return "; ".join(notes)


def budget_text(runs: list[dict]) -> str:
    """The runs' budget as configured (total_steps; the trained steps are whole iterations of it), in its unit:
    env steps, or generated tokens on token tasks."""
    total = max(run["config"]["total_steps"] for run in runs)
    if is_token_task(runs):
        return f"{total:,} tokens" if steps_are_tokens(runs) else f"{total:,} env steps"
    return f"{steps_text(total)} steps"


def is_token_task(runs: list[dict]) -> bool:
    return all(run.get("config", {}).get("env", {}).get("family") == "rlhf" for run in runs)


def steps_are_tokens(runs: list[dict]) -> bool:
    """Whether a token task's env steps are its generated tokens: with autoreset same_step every step writes a
    token; runs made with next_step (the key's value where their config lacks it) spent a no-op step per
    finished response."""
    return all((run["config"]["env"].get("kwargs") or {}).get("autoreset", "next_step") == "same_step" for run in runs)


# A token task's judge, where its score has a name of its own (RLHFArithmetic's judge pays 1 for the exact sum).
JUDGE_METRIC = {"RLHFArithmetic": "fraction right"}


def axis_names(runs: list[dict]) -> tuple[str, str]:
    """(x, y) axis names of these runs' evaluation curves: env steps and the deterministic evaluation return, or
    on token tasks generated tokens and what their evaluation scores (the judge's or the reward model's score
    of greedy or sampled responses, as the runs' config says)."""
    if not runs or not is_token_task(runs):
        return "environment steps", "deterministic evaluation return"
    env = runs[0]["config"]["env"]
    decoding = "sampled" if (env.get("evaluation") or {}).get("kind") == "sampled" else "greedy"
    metric = reward_name(env)
    steps = "generated tokens" if steps_are_tokens(runs) else "env steps (generated tokens, a no-op step per response)"
    return steps, f"{metric} of {decoding} responses"


def env_title(runs: list[dict]) -> str:
    """The task as a title names it: its Gymnasium id, without a module path (benchmarks.rlhf.env:RLHF/...)."""
    return runs[0]["config"]["env"]["id"].split(":")[-1]


def wrapped(text: str, width_inches: float, fontsize: float = 9) -> str:
    """A title broken into lines that fit a figure width_inches wide (about 0.55 em per character)."""
    import textwrap

    return textwrap.fill(text, width=max(30, int(width_inches * 72 / (0.55 * fontsize))))


def plot_versus_ppo(runs: list[dict], suite: str, plots_dir: Path, min_seeds: int = 1) -> list[Path]:
    """Per task, one small panel per variant with PPO drawn in each, on a shared y-axis.

    The question a reader asks is "this variant against PPO"; seven overlapping bands on one axis
    cannot answer it. Mean over seeds with a 95% percentile-bootstrap band; each panel's title names its variant
    (in its colour) and n, the figure's title PPO's n: no legend box over the curves. Only presets with min_seeds
    seeds or more are compared (the report: MIN_SEEDS_FOR_CI, as its aggregates); a task with no such variant, or
    too few PPO seeds, gets no figure (an earlier one is removed).
    """
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    written = []
    for env in sorted({run["env"] for run in runs}):
        task_runs = [run for run in runs if run["env"] == env]
        seeds = {algo: len({run["seed"] for run in task_runs if run["algo"] == algo})
                 for algo in {run["algo"] for run in task_runs}}
        variants = sorted(algo for algo, n in seeds.items() if algo != "ppo" and n >= min_seeds)
        stem = plots_dir / f"{suite}_{env}_vs_ppo"
        if seeds.get("ppo", 0) < max(1, min_seeds) or not variants:
            stem.with_name(stem.name + ".png").unlink(missing_ok=True)
            continue
        columns = min(3, len(variants))
        rows = -(-len(variants) // columns)
        fig, axes = plt.subplots(rows, columns, figsize=(3.6 * columns, 2.7 * rows + 0.5), sharex=True, sharey=True,
                                 squeeze=False)
        twins, counts = identical_to(task_runs), {}
        for ax, variant in zip(axes.flat, variants):
            for algo in ("ppo", variant):
                curves = eval_curves([run for run in task_runs if run["algo"] == algo])
                counts[algo] = curves.shape[1]
                mean = curves.mean(axis=1)
                color, marker = algo_style(algo)
                ax.plot(mean.index, mean.to_numpy(), color=color, marker=marker, markersize=2.5,
                        linewidth=1.6 if algo == "ppo" else 1.3)
                if curves.shape[1] > 1:
                    low, high = bootstrap_mean_ci(curves.to_numpy().T)
                    ax.fill_between(mean.index, low, high, alpha=0.2, color=color, linewidth=0)
            same = f", same curve as {twins[variant]}" if variant in twins else ""
            ax.set_title(f"{variant} ({seeds_label(counts[variant])}{same})", fontsize=9, color=algo_color(variant))
            ax.grid(alpha=0.3)
            ax.xaxis.set_major_formatter(FuncFormatter(_format_steps))
            ax.tick_params(labelbottom=True, labelsize=7)  # every panel readable on its own
        for ax in axes.flat[len(variants):]:
            ax.set_visible(False)
        x_label, y_label = axis_names(task_runs)
        for ax in axes[:, 0]:
            ax.set_ylabel(wrapped(y_label, 2.0, 8), fontsize=8)
        for ax in axes[-1, :]:
            ax.set_xlabel(x_label, fontsize=8)
        fig.suptitle(wrapped(f"{suite}: {env_title(task_runs)}, {budget_text(task_runs)} - each variant (its panel's "
                             f"title, in its colour) against PPO (black, {seeds_label(counts['ppo'])}); "
                             f"{band_note(counts.values())}{figure_notes(task_runs)}", 3.6 * columns), fontsize=9)
        # PNG only: the panels repeat the all-in-one figure's data (whose SVG is there for papers)
        written += save_figure(fig, stem, suffixes=(".png",), dpi=110)
    return written


def random_score(task: str) -> float | None:
    """A task's random_score (a uniform-random policy's mean return) from its conf/env file, where it says how
    it was measured; None for a task with no conf/env file."""
    from omegaconf import OmegaConf

    path = CONF_ENV / f"{task}.yaml"
    return OmegaConf.load(path).get("random_score") if path.exists() else None


MIN_AGGREGATE_TASKS = 2  # an "aggregate" over one task is that task's score: not drawn
SATURATED_SCORE = 0.98  # a task saturates when at least half of its runs end at or above this normalised score


def task_bounds(runs: list[dict]) -> dict[str, tuple[float, float]]:
    """task -> (random_score, best) of the one normalisation every aggregate uses, (return - random) / (best -
    random): 0 is a uniform-random policy, 1 the highest evaluation return any run of these runs reached on the
    task, at any evaluation. It needs no per-task reference score, so every task of a suite has one, and no
    score, final or along a curve, exceeds 1. Tasks with no random_score, or where no run beat it, have none."""
    bounds = {}
    for task in sorted({run["env"] for run in runs}):
        low = random_score(task)
        best = max(float(run["eval"]["eval_return_mean"].max()) for run in runs if run["env"] == task)
        if low is not None and best > low:
            bounds[task] = (float(low), best)
    return bounds


def normalised(values, bounds: tuple[float, float]):
    low, best = bounds
    return (values - low) / (best - low)


def normalised_final_scores(runs: list[dict]) -> tuple[dict[str, np.ndarray], list[str]]:
    """algo -> [seeds x tasks] matrix of normalised final returns, over tasks every algo ran with equal seeds."""
    bounds = task_bounds(runs)
    scored = sorted(bounds)
    algos = sorted({run["algo"] for run in runs})
    matrices = {}
    for algo in algos:
        columns = []
        for task in scored:
            group = [run for run in runs if run["env"] == task and run["algo"] == algo]
            if not group:
                break
            columns.append(normalised(eval_curves(group).iloc[-1].to_numpy(), bounds[task]))
        if len(columns) == len(scored) and len({len(c) for c in columns}) == 1:
            matrices[algo] = np.stack(columns, axis=1)
    return matrices, scored


def presets_left_out(runs: list[dict], matrices: dict[str, np.ndarray], tasks: list[str]) -> list[str]:
    """The suite's presets an aggregate leaves out, each with why: a task it did not run, or a number of seeds that
    differs from task to task (normalised_final_scores)."""
    left_out = []
    for algo in sorted({run["algo"] for run in runs} - set(matrices)):
        seeds = {task: len([run for run in runs if run["env"] == task and run["algo"] == algo]) for task in tasks}
        if missing := [task for task, count in seeds.items() if count == 0]:
            left_out.append(f"{algo} (no run of {', '.join(missing)})")
        else:
            left_out.append(f"{algo} ({', '.join(f'{count} seeds on {task}' for task, count in seeds.items())})")
    return left_out


def aggregate_scope(runs: list[dict]) -> tuple[dict[str, np.ndarray], list[str], str | None]:
    """The normalised final scores an aggregate is made of, and why none is made (None when one is): an
    aggregate needs at least MIN_AGGREGATE_TASKS tasks, a preset that ran every one of them with one number of seeds
    on each, and MIN_SEEDS_FOR_CI seeds of each such preset."""
    matrices, tasks = normalised_final_scores(runs)
    every_task = sorted({run["env"] for run in runs})
    if len(every_task) < MIN_AGGREGATE_TASKS:
        return matrices, tasks, (f"{len(every_task)} task{'s' * (len(every_task) != 1)} (an aggregate needs "
                                 f"{MIN_AGGREGATE_TASKS})")
    unequal = unequal_budgets([run for run in runs if run["env"] in tasks and run["algo"] in matrices])
    if unequal:
        return matrices, tasks, f"presets trained different budgets on {unequal} (an aggregate compares equal ones)"
    if len(tasks) < MIN_AGGREGATE_TASKS:
        why = {True: "no random_score in conf/env", False: "no run above its random_score"}
        unscored = [f"{task} ({why[random_score(task) is None]})" for task in every_task if task not in tasks]
        return matrices, tasks, (f"{len(tasks)} of its {len(every_task)} tasks can be normalised (an aggregate needs "
                                 f"{MIN_AGGREGATE_TASKS}; {', '.join(unscored)})")
    if not matrices:
        return matrices, tasks, (f"no preset ran all {len(tasks)} tasks it can normalise with one number of seeds on "
                                 f"each (an aggregate compares presets over the same tasks)")
    seeds = min(m.shape[0] for m in matrices.values())
    if seeds < MIN_SEEDS_FOR_CI:
        return matrices, tasks, f"{seeds} seed{'s' * (seeds != 1)} per task (an aggregate needs {MIN_SEEDS_FOR_CI})"
    return matrices, tasks, None


def saturated_tasks(matrices: dict[str, np.ndarray], tasks: list[str]) -> list[str]:
    """Tasks on which at least half of the runs (every preset's seeds) end within 2% of the best: they cannot
    separate the presets near the top, so an aggregate flags them."""
    scores = np.concatenate(list(matrices.values()), axis=0)
    return [task for j, task in enumerate(tasks) if np.mean(scores[:, j] >= SATURATED_SCORE) >= 0.5]


def task_saturated(task_runs: list[dict]) -> bool:
    """saturated_tasks' rule for one task of any suite, over all its runs (every preset's seeds): at least half of
    them end within 2% of the best evaluation any of them reached; judged from MIN_SEEDS_FOR_CI runs on (fewer, and
    one run's own best is no ceiling)."""
    if len(task_runs) < MIN_SEEDS_FOR_CI:
        return False
    bounds = task_bounds(task_runs)
    if len(bounds) != 1:
        return False
    bound = next(iter(bounds.values()))
    finals = np.concatenate([normalised(eval_curves(group).iloc[-1].to_numpy(), bound)
                             for group in group_runs(task_runs).values()])
    return bool(np.mean(finals >= SATURATED_SCORE) >= 0.5)


def saturation_note(task: str, runs: int) -> str:
    """The flag a figure of a saturated task carries (its title)."""
    return (f"{task} saturates: at least half of its {runs} runs end within {1 - SATURATED_SCORE:.0%} of the best "
            f"evaluation any run reached, so it cannot rank the presets near the top")


def task_list(tasks: list[str], saturated: list[str]) -> str:
    """'A, B (saturated), C': the tasks of an aggregate, each saturating one flagged."""
    return ", ".join(f"{t} (saturated)" if t in saturated else t for t in tasks)


SAMPLE_EFFICIENCY_POINTS = 21  # grid of budget fractions when tasks evaluate at different env steps


def normalised_curves(runs: list[dict]) -> tuple[dict[str, np.ndarray], np.ndarray, str, list[str]]:
    """algo -> [seeds x tasks x points] normalised eval returns over training, the x values and their label.

    The same tasks and equal seeds as normalised_final_scores. x is env steps when every task evaluated at
    the same steps; otherwise each curve is interpolated onto fractions of its own budget.
    """
    matrices, tasks = normalised_final_scores(runs)
    bounds = task_bounds(runs)
    curves = {algo: [] for algo in matrices}
    grids = set()
    for algo in matrices:
        for task in tasks:
            group = [run for run in runs if run["env"] == task and run["algo"] == algo]
            curve = normalised(eval_curves(group), bounds[task])
            curves[algo].append(curve)
            grids.add(tuple(curve.index))
    if len(grids) == 1:
        x, label = np.array(next(iter(grids)), dtype=float), "env steps"
        stacked = {algo: np.stack([c.to_numpy().T for c in per_task], axis=1) for algo, per_task in curves.items()}
    else:
        # from the latest first evaluation on: a curve is not drawn before its first point (np.interp would
        # carry that point back flat to 0: a preset evaluated first at mid-budget seemed to start there)
        start = max(c.index.min() / c.index.max() for per_task in curves.values() for c in per_task)
        x, label = np.linspace(start, 1.0, SAMPLE_EFFICIENCY_POINTS), "fraction of the env-step budget"

        def resampled(curve: pd.DataFrame) -> np.ndarray:  # [seeds, points]
            fraction = curve.index.to_numpy(dtype=float) / curve.index.max()
            return np.stack([np.interp(x, fraction, curve[seed].to_numpy()) for seed in curve.columns])

        stacked = {algo: np.stack([resampled(c) for c in per_task], axis=1) for algo, per_task in curves.items()}
    return stacked, x, label, tasks


def plot_sample_efficiency(runs: list[dict], suite: str, plots_dir: Path) -> list[Path]:
    """rliable's IQM sample-efficiency curves: at each evaluation, the IQM of normalised scores over all runs
    (tasks x seeds) with its 95% stratified-bootstrap CI, one line per algorithm, n runs each in the legend.
    Drawn only where an aggregate is (aggregate_scope)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    matrices, tasks, refused = aggregate_scope(runs)
    if refused or len(matrices) < 2:
        return []
    curves, x, label, tasks = normalised_curves(runs)

    def iqm_per_point(scores: np.ndarray) -> np.ndarray:  # [runs, tasks, points] -> IQM at each point
        return trimmed_means(scores.reshape(-1, scores.shape[-1]))

    point, interval = per_preset_estimates(curves, iqm_per_point)
    fig, ax = plt.subplots(figsize=(7.0, 4.2))
    for algo in sorted(curves, key=lambda a: (a != "ppo", a)):
        color, marker = algo_style(algo)
        ax.plot(x, point[algo], color=color, marker=marker, markersize=3.5, linewidth=2.0 if algo == "ppo" else 1.4,
                label=f"{algo} (n={curves[algo].shape[0]} x {len(tasks)})")
        ax.fill_between(x, interval[algo][0], interval[algo][1], color=color, alpha=0.15, linewidth=0)
    if label == "env steps":
        ax.xaxis.set_major_formatter(FuncFormatter(_format_steps))
        label = axis_names(runs)[0]
    ax.set_xlabel(label)
    ax.set_ylabel("IQM of normalised scores")
    ax.set_ylim(min(0.0, ax.get_ylim()[0]), 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False,
              title="n = seeds x tasks", title_fontsize=7)
    saturated = saturated_tasks(matrices, tasks)
    ax.set_title(wrapped(f"{suite}: IQM over {len(tasks)} tasks ({task_list(tasks, saturated)}), "
                         f"{budget_text(runs)}; 95% stratified-bootstrap CIs (rliable)", 7.0), fontsize=9)
    return save_figure(fig, plots_dir / f"{suite}_sample_efficiency", suffixes=(".png",), dpi=110)


def aggregate_estimates(scores: np.ndarray) -> np.ndarray:
    """rliable's aggregate_iqm and aggregate_mean of a [runs x tasks] matrix (the same arithmetic, without scipy's
    per-call overhead). No optimality gap: no normalised score exceeds 1 (task_bounds), so the gap below 1 is
    1 - mean."""
    return np.array([interquartile_mean(scores), np.mean(np.mean(scores, axis=0))])


def aggregate_table(runs: list[dict]) -> pd.DataFrame | None:
    """IQM and mean of normalised final scores with stratified-bootstrap 95% CIs, and P(improve over PPO); None
    where no aggregate is made (aggregate_scope)."""
    matrices, tasks, refused = aggregate_scope(runs)
    if refused:
        return None
    point, interval = per_preset_estimates(matrices, aggregate_estimates)
    rows = []
    for algo in sorted(matrices):
        row = {"algo": algo, "tasks": len(tasks), "seeds_per_task": matrices[algo].shape[0]}
        for i, name in enumerate(("iqm", "mean")):
            row[name], row[f"{name}_ci_low"], row[f"{name}_ci_high"] = point[algo][i], *interval[algo][:, i]
        if algo != "ppo" and "ppo" in matrices:
            row["poi_vs_ppo"], row["poi_ci_low"], row["poi_ci_high"] = probability_of_improvement(
                matrices[algo], matrices["ppo"])
        rows.append(row)
    table = pd.DataFrame(rows)
    saturated = saturated_tasks(matrices, tasks)
    table["task_names"] = " ".join(tasks)
    table["saturated_tasks"] = " ".join(saturated)
    table.attrs["tasks"], table.attrs["saturated"] = tasks, saturated
    table.attrs["left_out"] = presets_left_out(runs, matrices, tasks)
    return table


def plot_aggregate(table: pd.DataFrame, runs: list[dict], suite: str, plots_dir: Path) -> list[Path]:
    """rliable's figure set for a suite, from its aggregate table: IQM, mean and P(improve over PPO) of normalised
    final scores with their stratified-bootstrap 95% CIs (panels from 0), n runs beside each, and the performance
    profile (fraction of runs scoring above tau, with 95% CIs). One colour per algorithm as everywhere."""
    import matplotlib.pyplot as plt
    from rliable import library as rly

    matrices, tasks, _ = aggregate_scope(runs)
    algos = sorted(matrices, key=lambda a: (a != "ppo", a))
    runs_of = {algo: f"{algo} (n={matrices[algo].shape[0]} x {len(tasks)})" for algo in algos}
    fig, axes = plt.subplots(1, 4, figsize=(15.0, 0.45 * len(algos) + 1.9),
                             gridspec_kw={"width_ratios": [1, 1, 1, 1.5]})
    rows = {row["algo"]: row for _, row in table.iterrows()}
    panels = [("iqm", "IQM"), ("mean", "mean"), ("poi", "P(improve over PPO)")]
    for ax, (name, label) in zip(axes, panels):
        key = "poi_vs_ppo" if name == "poi" else name
        low_edge = 0.0
        for position, algo in enumerate(algos):
            row = rows[algo]
            if key not in row or pd.isna(row[key]):
                continue
            low, high = (row["poi_ci_low"], row["poi_ci_high"]) if name == "poi" else \
                (row[f"{name}_ci_low"], row[f"{name}_ci_high"])
            low_edge = min(low_edge, low)
            color = algo_color(algo)
            ax.barh(position, high - low, left=low, height=0.6, color=color, alpha=0.35)
            ax.plot([row[key]] * 2, [position - 0.3, position + 0.3], color=color, linewidth=2.0)
        if name == "poi":
            ax.axvline(0.5, color="#777777", linestyle="--", linewidth=0.8)
        ax.set_xlim(low_edge - 0.03, 1.03)  # from 0 (or below random), a margin so that a bar at 0 or 1 shows
        ax.set_yticks(range(len(algos)))
        ax.set_yticklabels([runs_of[a] for a in algos] if ax is axes[0] else [], fontsize=8)
        ax.set_title(label, fontsize=9)
        ax.grid(axis="x", alpha=0.3)
        ax.tick_params(labelsize=7)
        ax.invert_yaxis()
    # performance profile: fraction of runs (all tasks x seeds) with normalised score > tau
    lowest = min(0.0, min(m.min() for m in matrices.values()) - 0.05)
    taus = np.linspace(lowest, 1.0, 61)
    profiles, profile_cis = {}, {}
    for algo in algos:  # each preset's band from its own resamples, as the table's intervals (per_preset_estimates)
        np.random.seed(0)
        profile, profile_ci = rly.create_performance_profile({algo: matrices[algo]}, taus,
                                                             reps=BOOTSTRAP_RESAMPLES // 4)
        profiles[algo], profile_cis[algo] = profile[algo], profile_ci[algo]
    ax = axes[-1]
    for algo in algos:
        color, marker = algo_style(algo)
        ax.plot(taus, profiles[algo], color=color, linewidth=1.8 if algo == "ppo" else 1.3, label=runs_of[algo])
        ax.fill_between(taus, profile_cis[algo][0], profile_cis[algo][1], color=color, alpha=0.15, linewidth=0)
    ax.set_title("performance profile: fraction of runs with score > tau", fontsize=9)
    ax.set_xlabel("normalised final score tau", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False,
              title="n = seeds x tasks", title_fontsize=7)
    fig.suptitle(wrapped(f"{suite}: final scores over {len(tasks)} tasks ({task_list(tasks, table.attrs['saturated'])}),"
                         f" {budget_text(runs)}, normalised per task from its random_score (0) to the best evaluation "
                         f"any run reached (1); 95% stratified-bootstrap CIs (rliable)", 15.0), fontsize=9)
    return save_figure(fig, plots_dir / f"{suite}_aggregate", suffixes=(".png",), dpi=110)


def aggregate_markdown(table: pd.DataFrame, suite: str) -> str:
    def interval(name):
        return [f"{m:.3f} [{lo:.3f}, {hi:.3f}]" for m, lo, hi in
                zip(table[name], table[f"{name}_ci_low"], table[f"{name}_ci_high"])]

    shown = pd.DataFrame({"algo": table["algo"], "tasks": table["tasks"], "seeds/task": table["seeds_per_task"],
                          "IQM [95% CI]": interval("iqm"), "mean [95% CI]": interval("mean")})
    if "poi_vs_ppo" in table:
        shown["P(improve over PPO) [95% CI]"] = [
            "" if pd.isna(p) else f"{p:.2f} [{lo:.2f}, {hi:.2f}]"
            for p, lo, hi in zip(table["poi_vs_ppo"], table["poi_ci_low"], table["poi_ci_high"])]
    saturated = table.attrs["saturated"]
    flag = (f" Saturated (at least half of the runs end within {1 - SATURATED_SCORE:.0%} of the best, so the task "
            f"cannot separate the presets near the top): {', '.join(saturated)}." if saturated else "")
    if table.attrs["left_out"]:  # said, not silent: PPO among them takes P(improve over PPO) away too
        flag += (f" Left out, as an aggregate compares presets over the same tasks with one number of seeds on each: "
                 f"{', '.join(table.attrs['left_out'])}.")
    return (
        f"# {suite}: across tasks\n\nNormalised final return (return - random) / (best - random) per task: random = "
        f"the task's random_score (conf/env, which says how it was measured), best = the highest evaluation return any "
        f"run of this suite reached on the task (tasks: {', '.join(table.attrs['tasks'])}).{flag} rliable's IQM and "
        f"mean with stratified-bootstrap 95% CIs ({BOOTSTRAP_RESAMPLES} resamples, drawn for each preset from its own "
        f"runs and one fixed seed: a preset joining the suite moves another's only through a task's best return)"
        + (", and probability of improvement over PPO.\n\n" if "poi_vs_ppo" in table else
           "; no probability of improvement over PPO, which is left out.\n\n") + shown.to_markdown(index=False) + "\n"
    )


SENSITIVITY_AXES = ("algo.outer_optimizer.lr", "algo.outer_optimizer.momentum")  # a sensitivity grid's axes


def left_out_of_the_grid(runs: list[dict], gridded: set[tuple[str, str]]) -> str:
    """What a sensitivity suite's report leaves out, said: the runs of its other presets (PPO's among them), given
    the (task, preset) pairs its grids draw."""
    others = sorted({(run["env"], run["algo"]) for run in runs} - gridded)
    return (f"; left out (a sensitivity suite reports its grid): {', '.join(f'{env}/{algo}' for env, algo in others)}"
            if others else "")


def sensitivity_grids(runs: list[dict]) -> dict[str, tuple[str, dict[tuple[float, float], list[float]]]]:
    """task -> (preset, {(outer lr sigma, outer momentum mu): final returns}) of an Outer-PPO preset swept over both
    (a sensitivity suite; different presets are not grid points)."""
    grids = {}
    outer = [run for run in runs if run["config"]["algo"]["algorithm"] == "outer_ppo"]
    for env, algo in sorted({(run["env"], run["algo"]) for run in outer}):
        cells: dict[tuple, list[float]] = {}
        for run in (r for r in outer if (r["env"], r["algo"]) == (env, algo)):
            optimizer = run["config"]["algo"]["outer_optimizer"]
            key = (float(optimizer["lr"]), float(optimizer["momentum"]))
            cells.setdefault(key, []).append(run["eval"]["eval_return_mean"].iloc[-1])
        if len({k[0] for k in cells}) >= 2 and len({k[1] for k in cells}) >= 2:
            grids[env] = (algo, cells)
    return grids


def sensitivity_cells(runs: list[dict], env: str, cells: dict[tuple[float, float], list[float]]) -> dict:
    """One sensitivity grid's cells: (sigma, mu) -> (mean final return, seeds, at the ceiling: the mean within 2% of
    the best evaluation any run of the grid reached, where a cell cannot be ranked against another there)."""
    bounds = task_bounds([run for run in runs if run["env"] == env]).get(env)
    return {key: (float(np.mean(finals)), len(finals),
                  bounds is not None and float(normalised(np.mean(finals), bounds)) >= SATURATED_SCORE)
            for key, finals in sorted(cells.items())}


def plot_sensitivity(runs: list[dict], suite: str, plots_dir: Path) -> list[Path]:
    """Outer-PPO sensitivity: mean final return over outer lr sigma x outer momentum mu, one heatmap per task;
    cells at the ceiling (sensitivity_cells) marked *."""
    import matplotlib.pyplot as plt

    written = []
    for env, (algo, cells) in sensitivity_grids(runs).items():
        summary = sensitivity_cells(runs, env, cells)
        sigmas, mus = sorted({k[0] for k in cells}), sorted({k[1] for k in cells})
        grid = np.full((len(mus), len(sigmas)), np.nan)
        for (sigma, mu), (mean, _, _) in summary.items():
            grid[mus.index(mu), sigmas.index(sigma)] = mean
        fig, ax = plt.subplots(figsize=(1.2 * len(sigmas) + 2.5, 0.9 * len(mus) + 1.8))
        image = ax.imshow(grid, origin="lower", cmap="viridis", aspect="auto")
        middle = np.nanmin(grid) + 0.6 * (np.nanmax(grid) - np.nanmin(grid))
        for (sigma, mu), (mean, _, ceiling) in summary.items():  # dark text on viridis' yellow end, white elsewhere
            ax.text(sigmas.index(sigma), mus.index(mu), f"{mean:.0f}{'*' if ceiling else ''}", ha="center",
                    va="center", fontsize=9, color="black" if mean > middle else "white",
                    fontweight="bold" if ceiling else "normal")
        ax.set_xticks(range(len(sigmas)), [f"{s:g}" for s in sigmas])
        ax.set_yticks(range(len(mus)), [f"{m:g}" for m in mus])
        ax.set_xlabel("outer learning rate sigma")
        ax.set_ylabel("outer Nesterov momentum mu")
        task_runs = [run for run in runs if run["env"] == env]
        seeds = sorted({n for _, n, _ in summary.values()})
        ceiling = sum(c for _, _, c in summary.values())
        mark = (f"; * {plural(ceiling, 'cell')} at the ceiling: mean within {1 - SATURATED_SCORE:.0%} of the best "
                f"evaluation any run reached, not ranked against each other" if ceiling else "")
        ax.set_title(wrapped(f"{suite}: {env_title(task_runs)}, {budget_text(task_runs)} - "
                             f"{algo}'s final eval return, mean of "
                             f"{'-'.join(map(str, seeds))} seeds per cell{mark}", 1.2 * len(sigmas) + 2.5, 10),
                     fontsize=10)
        fig.colorbar(image, ax=ax, label="final eval return")
        written += save_figure(fig, plots_dir / f"{suite}_{env}_sensitivity")
    return written


def suite_command(suite_dir: Path) -> str:
    """The sweep command, rebuilt from Hydra's multirun.yaml.

    Overrides of a key the experiment sweeps itself are left out: a suite may
    have been run in parts (subsets of the experiment's own grid), and the
    experiment file lists the whole grid. Every other override is kept, so the
    command trains what the suite holds.
    """
    from omegaconf import OmegaConf

    multirun = suite_dir / "multirun.yaml"
    if not multirun.exists():  # single runs: each run's own command line
        commands = sorted({"python run.py " + shlex.join(OmegaConf.to_container(OmegaConf.load(path), resolve=False))
                           for path in suite_dir.rglob(".hydra/overrides.yaml")})
        return "; ".join(commands) if commands else f"runs under {suite_dir}"

    # the overrides as typed: one may hold an interpolation (hydra.sweep.subdir="${...}"), not resolved here
    overrides = OmegaConf.to_container(OmegaConf.load(multirun).hydra.overrides, resolve=False)
    narrowed = set()
    for override in overrides["task"]:
        if override.startswith("+experiment="):  # the experiment's own grid, e.g. env for the mujoco suite
            experiment = OmegaConf.load(CONF_ENV.parent / "experiment" / f"{override.split('=', 1)[1]}.yaml")
            narrowed |= set(OmegaConf.select(experiment, "hydra.sweeper.params", default={}) or {})
    kept = [o for o in overrides["task"] if o.split("=", 1)[0] not in narrowed]
    kept += [o for o in overrides["hydra"] if o.startswith(("hydra.sweep.dir=", "hydra.sweep.subdir="))]
    return "python run.py -m " + shlex.join(kept)  # quoted where a shell would expand or split one


def made_by(suite_dir: Path, runs: list[dict]) -> str:
    """What a table's header says made the suite: the sweep command, and where multirun.yaml (the last sweep's) does
    not name all the suite holds, that earlier commands into the same directory made the rest."""
    command = suite_command(suite_dir)
    others = not_swept_by(shlex.split(command)[3:], runs) if command.startswith("python run.py -m ") else ""
    return f"`{command}`" + (f" and earlier commands into the same directory (its runs of {others})" if others else "")


def not_swept_by(overrides: list[str], runs: list[dict]) -> str:
    """The tasks and presets of `runs` that a sweep's env=/algo= overrides (read as Hydra reads them: a value, a
    comma list, a sweep function) do not name, as text ('algo ppo'); empty where they name every one, or where the
    sweep does not choose them (an experiment's grid) or renames them (env.name=, algo.name=)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:  # an override this reading cannot parse: nothing is claimed
        return ""
    chosen = {override.key_or_group: override for override in parsed}
    missing = []
    for key in ("env", "algo"):
        override = chosen.get(key)
        if override is None or f"{key}.name" in chosen:
            continue
        values = list(override.sweep_iterator()) if override.is_sweep_override() else [override.value()]
        named = {getattr(value, "text", value) for value in values}  # a quoted value as Hydra passes it on
        held = sorted({run[key] for run in runs if run[key] not in named})
        if held:
            missing.append(f"{key} {', '.join(held)}")
    return "; ".join(missing)


def kl_coef(run: dict) -> float | None:
    penalty = run["config"]["env"].get("kl_penalty")
    return None if penalty is None else float(penalty["coef"])


def pays_judge(env: dict) -> bool:
    """A token task whose training reward is its judge's score (env kwargs reward: judge)."""
    return (env.get("kwargs") or {}).get("reward") == "judge"


def reward_is_judge(runs: list[dict]) -> bool:
    """Runs whose reward model and true objective are one score: a frontier has one panel and no reward hacking
    can show."""
    return all(pays_judge(run["config"]["env"]) for run in runs)


def reward_name(env: dict) -> str:
    """What a token task's training reward scores, by its own name (the judge's where the reward is its judge)."""
    return judge_name(env) if pays_judge(env) else "reward model's score"


def judge_name(env: dict) -> str:
    return JUDGE_METRIC.get(env["name"], "judge's score")


def frontier_lines(runs: list[dict]) -> dict[tuple[str, float], list]:
    """(preset, KL coefficient) -> its runs, PPO first: the lines of a task's KL frontier."""
    lines: dict[tuple[str, float], list] = {}
    for run in runs:
        lines.setdefault((run["algo"], kl_coef(run)), []).append(run)
    return dict(sorted(lines.items(), key=lambda item: (item[0][0] != "ppo", item[0])))


def plot_kl_frontier(runs: list[dict], suite: str, plots_dir: Path) -> list[Path]:
    """Token tasks: the RLHF frontier, reward against KL to the reference, one line per (preset, KL coefficient).

    Each point is one rollout, the mean over seeds of its finished responses' reward (episode_return_mean) and KL
    estimate (kl_to_reference); the line runs from the start (KL 0) to the end of training (a larger marker). A
    second panel draws the judge's score (episode_judge), where a task's reward is not its judge: reward hacking is
    the reward model's score rising while the judge's falls. No interval is drawn: n in the legend."""
    import matplotlib.pyplot as plt

    written = []
    token_runs = [run for run in runs if kl_coef(run) is not None]
    for env in sorted({run["env"] for run in token_runs}):
        task_runs = [run for run in token_runs if run["env"] == env]
        lines = {key: [read_csv_complete_rows(run["dir"] / "train.csv") for run in group]
                 for key, group in frontier_lines(task_runs).items()}
        judged = all("episode_judge" in log for logs in lines.values() for log in logs)
        same_score = reward_is_judge(task_runs) or (judged and all(
            np.allclose(log["episode_return_mean"], log["episode_judge"], equal_nan=True)
            for logs in lines.values() for log in logs))
        two_panels = judged and not same_score
        fig, axes = plt.subplots(1, 2 if two_panels else 1, figsize=(11.0 if two_panels else 6.0, 4.2), squeeze=False)
        several_coefs = len({coef for _, coef in lines}) > 1
        drawn: dict[str, pd.DataFrame] = {}
        for (algo, coef), logs in lines.items():
            mean = pd.concat(logs).groupby("iteration").mean(numeric_only=True)
            color, marker = algo_style(algo)
            name = f"{algo}, KL coef {coef:g}" if several_coefs else algo
            columns = ["kl_to_reference", "episode_return_mean", *(["episode_judge"] if judged else [])]
            twin = next((other for other, line in drawn.items() if line.equals(mean[columns])), None)
            drawn[name] = mean[columns]
            label = f"{name} ({seeds_label(len(logs))}{f', the same line as {twin}' if twin else ''})"
            dashed = twin is not None or (several_coefs and coef <= 0)
            style = {"color": color, "linestyle": "--" if dashed else "-", "linewidth": 1.4}
            for ax, column in zip(axes[0], ("episode_return_mean", "episode_judge")):
                ax.plot(mean["kl_to_reference"], mean[column], label=label, **style)
                ax.plot(mean["kl_to_reference"].iloc[-1], mean[column].iloc[-1], marker=marker, markersize=8,
                        color=color)
        env_config = task_runs[0]["config"]["env"]
        reward = reward_name(env_config)
        axes[0][0].set_ylabel(reward + (" (normalised)" if reward == "reward model's score" else ""))
        what = "the reward (the judge's own score)" if same_score else "reward"
        axes[0][0].set_title(wrapped(f"{suite}: {env_title(task_runs)} - {what} of the rollout's responses against "
                                     f"KL to the reference, mean over seeds per rollout", 4.6), fontsize=9)
        if two_panels:
            axes[0][1].set_ylabel(f"{judge_name(env_config)} (the true objective)")
            axes[0][1].set_title("the judge's score of the same responses", fontsize=9)
        for ax in axes[0]:
            ax.set_xlabel("KL to the reference per response (nats, sampled estimate)")
            ax.grid(alpha=0.3)
        axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        written += save_figure(fig, plots_dir / f"{suite}_{env}_kl_frontier", suffixes=(".png",), dpi=110)
    return written


class NotReported(Exception):
    """A suite the report cannot make a table of (a preset's runs of several configurations), and why."""

    def __init__(self, suite: str, reason: str) -> None:
        super().__init__(suite, reason)  # the arguments a worker process pickles it by
        self.suite, self.reason = suite, reason

    def __str__(self) -> str:
        return f"{self.suite}: not reported: {self.reason}"


def report_suite(suite_dir: Path, out: Path, plots: bool = True) -> str:
    """Write one suite's tables and (with plots) figures into out/tables and out/plots; returns its progress line.
    An aggregate table or figure this suite no longer gets (too few tasks or seeds) is removed."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "ppo-variants-bench"  # stable SVG ids: unchanged figures stay identical
    skipped: list[tuple[Path, str]] = []
    runs = load_runs(suite_dir, skipped)
    for run_dir, reason in skipped:
        print(f"{suite_dir.name}: skipped {run_dir.relative_to(suite_dir)}: {reason}")
    if not runs:  # nothing to report is a failure to report, as summarize says it (exit 1), not a quiet skip
        raise NotReported(suite_dir.name, f"no complete runs under {suite_dir}")
    suite = suite_dir.name
    (out / "tables").mkdir(parents=True, exist_ok=True)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    if grids := sensitivity_grids(runs):  # a sensitivity grid: its heatmap is the result (tables would merge points)
        gridded = {(env, algo) for env, (algo, _) in grids.items()}
        # a cell's seeds are one configuration's
        if mixed := mixed_configurations([run for run in runs if (run["env"], run["algo"]) in gridded],
                                         swept=SENSITIVITY_AXES):
            raise NotReported(suite, mixed)
        written = plot_sensitivity(runs, suite, out / "plots") if plots else []
        return (f"{suite}: {len(runs)} runs -> {len(written)} sensitivity plot files"
                + left_out_of_the_grid(runs, gridded))
    written = []
    # a KL-coefficient sweep: its frontier is the result; a table per (task, preset) would merge the settings
    kl_sweep = any(len({kl_coef(run) for run in group}) > 1 for group in group_runs(runs).values())
    if kl_sweep and (mixed := mixed_configurations(runs, swept=("env.kl_penalty.coef",))):
        raise NotReported(suite, mixed)
    frontier = plot_kl_frontier(runs, suite, out / "plots") if plots else []
    if kl_sweep:
        return f"{suite}: {len(runs)} runs of several KL coefficients per preset -> {len(frontier)} frontier plot files"
    aggregate_files = [out / "tables" / f"{suite}_aggregate.csv", out / "tables" / f"{suite}_aggregate.md",
                       out / "plots" / f"{suite}_aggregate.png", out / "plots" / f"{suite}_sample_efficiency.png"]
    if (mixed := mixed_configurations(runs)) is not None:
        # what an earlier report averaged over the points goes: its tables, aggregate and figures
        tasks = sorted({run["env"] for run in runs})
        for stale in ([out / "tables" / f"{suite}.csv", out / "tables" / f"{suite}.md", *aggregate_files]
                      + [out / "plots" / f"{suite}_{task}{end}.{kind}" for task in tasks
                         for end in ("", "_vs_ppo") for kind in ("png", "svg")]):
            stale.unlink(missing_ok=True)
        raise NotReported(suite, mixed)
    table = suite_table(runs)
    table.round(6).to_csv(out / "tables" / f"{suite}.csv", index=False)
    left_out = "".join(f"\n{line}\n" for line in left_out_lines(suite_dir, skipped))  # the file says it too
    (out / "tables" / f"{suite}.md").write_text(markdown(table, suite, made_by(suite_dir, runs), display_path(suite_dir),
                                                         final_return_description(runs)) + left_out)
    aggregate = aggregate_table(runs)
    if aggregate is None:
        for path in aggregate_files:
            path.unlink(missing_ok=True)
        _, _, refused = aggregate_scope(runs)
        note = f"; no aggregate: {refused}"
    else:
        aggregate.round(6).to_csv(out / "tables" / f"{suite}_aggregate.csv", index=False)
        (out / "tables" / f"{suite}_aggregate.md").write_text(aggregate_markdown(aggregate, suite))
        note = f"; aggregate over {len(aggregate.attrs['tasks'])} tasks"
        if plots:
            written += plot_aggregate(aggregate, runs, suite, out / "plots")
            written += plot_sample_efficiency(runs, suite, out / "plots")
    if plots:
        written += plot_suite(runs, suite, out / "plots") + frontier
        written += plot_versus_ppo(runs, suite, out / "plots", min_seeds=MIN_SEEDS_FOR_CI)
    return f"{suite}: {len(runs)} runs -> tables/{suite}*.md, .csv and {len(written)} plot files{note}"


def suite_size(suite_dir: Path) -> int:
    """How many runs a suite holds: the biggest are started first, so two workers finish together."""
    return sum(1 for _ in suite_dir.rglob("summary.json"))


# What a suite's tables and figures are made from besides its runs: a change to any of these remakes every suite.
REPORT_INPUTS = [Path(__file__), Path(__file__).with_name("statistics.py"), Path(__file__).with_name("runs.py"),
                 Path(__file__).with_name("pack.py"), Path(__file__).parent / "engine" / "logger.py",
                 RESULTS / "reference" / "published.csv"]
STAMPS = RESULTS / "report_stamps.json"


# Files a run writes that git does not keep (.gitignore): checkpoints, TensorBoard events, locks. The report reads
# none of them, and a fresh clone has none, so a stamp over them would differ between the machine that trained the
# runs and every clone.
UNCOMMITTED_SUFFIXES = (".pt", ".lock", ".damaged", ".job")


def is_committed_kind(path: Path) -> bool:
    return not (path.name.endswith(UNCOMMITTED_SUFFIXES) or path.name.startswith("events.out.tfevents"))


def suite_stamp(suite_dir: Path) -> str:
    """A digest of every committed file of the suite's runs and of REPORT_INPUTS: equal digests, equal report."""
    import hashlib

    digest = hashlib.sha256()
    tasks = sorted(p.name for p in suite_dir.iterdir() if (CONF_ENV / f"{p.name}.yaml").exists())
    digest.update(json.dumps({task: random_score(task) for task in tasks}).encode())  # what normalises its scores
    tunings = sorted({name for path in suite_dir.rglob(".hydra/overrides.yaml")
                      if (name := tuning_override(path)) is not None})
    digest.update(json.dumps({name: tuning_steps(name) for name in tunings}).encode())  # what its titles say of them
    root = RESULTS.parent
    for path in [*REPORT_INPUTS, *sorted(p for p in suite_dir.rglob("*") if p.is_file() and is_committed_kind(p))]:
        digest.update(str(path.relative_to(root) if path.is_relative_to(root) else path).encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def report_suites(suites: list[Path], out: Path | None, jobs: int, plots: bool = True,
                  stamps: Path | None = None) -> list[str]:
    """Every suite's report, `jobs` suites at a time, one progress line per suite as it finishes. With stamps (a
    JSON file of suite -> suite_stamp), a suite whose runs and report code are those of its stamp is kept as it is.
    Returns the suites not reported (NotReported), which get no stamp."""
    import time
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from multiprocessing import get_context

    started = time.perf_counter()
    known = json.loads(stamps.read_text()) if stamps is not None and stamps.exists() else {}
    current = {suite_dir.name: suite_stamp(suite_dir) for suite_dir in suites} if stamps is not None else {}
    targets, kept = [], []
    for suite_dir in suites:
        if stamps is not None and known.get(suite_dir.name) == current[suite_dir.name]:
            kept.append(suite_dir.name)
        else:
            targets.append((suite_dir, out or default_out(suite_dir)))
    total, done = len(suites), 0

    def progress(line: str) -> None:
        nonlocal done
        done += 1
        print(f"[{done}/{total}, {time.perf_counter() - started:.0f} s] {line}", flush=True)

    refused = []

    def reported(report) -> None:
        try:
            progress(report())
        except NotReported as refusal:
            refused.append(refusal.suite)
            progress(str(refusal))

    for name in kept:
        progress(f"{name}: runs and report code unchanged, its tables and figures kept")
    if jobs <= 1 or len(targets) <= 1:
        for suite_dir, target in targets:
            reported(lambda: report_suite(suite_dir, target, plots))
    else:
        order = sorted(targets, key=lambda target: -suite_size(target[0]))
        # Workers forked from a parent that has imported what every report needs start in milliseconds, not
        # the seconds of a fresh interpreter's imports (matplotlib, rliable); where fork is unsafe, spawn.
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401
        import rliable.library  # noqa: F401
        import scipy.stats  # noqa: F401

        context = get_context("fork" if sys.platform == "linux" else "spawn")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            pending = [pool.submit(report_suite, suite_dir, target, plots) for suite_dir, target in order]
            for finished in as_completed(pending):
                reported(finished.result)
    if stamps is not None and plots:  # every suite's stamp; a suite whose runs left results/ leaves with them
        # a refused suite is checked again next time, whatever its stamp
        stamps.write_text(json.dumps({name: stamp for name, stamp in current.items() if name not in refused},
                                     indent=1, sort_keys=True) + "\n")
    return refused


def headline(table_paths: list[Path]) -> str:
    """Markdown pivot of written tables: one row per algorithm, one column per task, final return mean +- std."""
    read = []
    for path in table_paths:  # each a suite's result table (results/tables/<suite>.csv), or one line saying why not
        try:
            table = pd.read_csv(path)
        except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as error:
            raise SystemExit(f"error: --headline: {path} is not a CSV table ({error})") from None
        missing = [column for column in ("algo", "task", "env_steps", "final_mean", "final_std") if column not in table]
        if missing or table[["env_steps", "final_mean", "final_std"]].isna().any().any():
            raise SystemExit(f"error: --headline reads suite result tables (results/tables/<suite>.csv); {path} "
                             + (f"has no column {', '.join(missing)}" if missing else "has rows without a final return"))
        read.append(table)
    tables = pd.concat(read, ignore_index=True)
    tables["cell"] = [f"{m:.{places}f} +- {s:.{places}f}"
                      for m, s, places in zip(tables["final_mean"], tables["final_std"], task_decimals(tables))]
    tables["column"] = [f"{t} ({int(n) // 1000}k)" for t, n in zip(tables["task"], tables["env_steps"].round(-3))]
    twice = tables[tables.duplicated(["algo", "column"])]
    if len(twice):
        algo, column = twice.iloc[0][["algo", "column"]]
        raise SystemExit(f"error: --headline: the tables give {algo} on {column} more than once: name tables of "
                         f"different tasks or budgets")
    pivot = tables.pivot(index="algo", columns="column", values="cell").fillna("")
    order = sorted(pivot.index, key=lambda algo: (algo != "ppo", algo))
    return pivot.loc[order].to_markdown()


def main(argv=None) -> None:
    import os

    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suites", nargs="*", type=suite_directory, help="suite directories (default: every results/runs/*)")
    parser.add_argument("--out", type=Path, help="where tables/ and plots/ go (default: results/ for a suite under "
                        "results/runs, else a report/ folder beside the suite's runs)")
    parser.add_argument("--headline", nargs="+", type=existing_file, metavar="TABLE_CSV",
                        help="only print a Markdown pivot (algo x task, final return) of these written tables")
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)),
                        help="suites reported at once, one process each (default: this machine's cores)")
    parser.add_argument("--tables-only", action="store_true", help="write the tables (and figures.md), no figure")
    parser.add_argument("--force", action="store_true", help="remake every suite, changed or not (by default a "
                        "committed suite whose runs and report code match results/report_stamps.json is kept)")
    args = parser.parse_args(argv)
    if args.headline:
        print(headline(args.headline))
        return
    whole = not args.suites and not args.out
    suites = args.suites or committed_suites()
    refused = report_suites(suites, args.out, max(1, args.jobs), plots=not args.tables_only,
                            stamps=STAMPS if whole and not args.force else None)
    if whole and args.force and not args.tables_only:  # every suite remade: their stamps say so
        STAMPS.write_text(json.dumps({suite.name: suite_stamp(suite) for suite in suites if suite.name not in refused},
                                     indent=1, sort_keys=True) + "\n")
    if whole:  # the whole results/ regenerated: its figures page too
        (RESULTS / "figures.md").write_text(figures_page(RESULTS, suites))
        print("results/figures.md: every figure with its reading")
    if refused:
        raise SystemExit(f"error: not reported: {', '.join(refused)} (above: why)")


def committed_suites() -> list[Path]:
    return sorted(p for p in (RESULTS / "runs").iterdir() if p.is_dir())


# The suites the comparison rests on, first in results/figures.md (docs/results.md reads them); every other suite
# under results/runs follows under "Other suites" (docs/history.md says what each was for).
CURRENT_SUITES = ("mujoco_1m", "classic_10seeds", "rlhf", "rlhf_kl",
                  "default_budget_300k", "ppo_mujoco_1M", "ppo_cartpole_100k", "ppo_cartpole_500k", "ppo_cartpole_zoo_100k")


def figures_page(out: Path, suites: list[Path], drawn: Path | None = None) -> str:
    """results/figures.md: every figure of these suites, each with one line of what it reads (its title says what
    it shows), from the tables beside it and the suites' run configs (summary.json); so the page regenerates byte
    for byte with them. A figure is listed where it is in `drawn` (default: out; a check of tables made without
    figures points it at results/)."""
    lines = ["# Figures", "",
             "Every figure `python -m benchmarks.report` makes from the runs under `runs/`, each with what it reads. "
             "Each suite's section links its table; numbers are final evaluation scores, mean over seeds: the "
             "deterministic evaluation return on control tasks, on token tasks the score the caption names. Each "
             "figure's title says whether it draws bands (95% bootstrap over seeds, where a curve has two or more). "
             f"Panels against PPO and P(improve over PPO) are drawn for presets with at least {MIN_SEEDS_FOR_CI} "
             f"seeds, as the aggregates require. A task saturates where at least half of its runs end within "
             f"{1 - SATURATED_SCORE:.0%} of the best evaluation any run reached: it cannot rank the presets near the "
             "top, and its figures say so.", "",
             "Aggregates normalise each task from its random_score (0; conf/env says how it was measured) to the "
             "best evaluation any run of the suite reached on it (1). Each aggregate's sample-efficiency figure draws "
             "the same normalised scores at every evaluation: their IQM over tasks and seeds with its 95% "
             "stratified-bootstrap CI, how fast each preset learns across tasks.", "",
             "No figure draws wall time: these runs shared the machine with other runs. Speed is measured by "
             "`python -m benchmarks.speed.throughput` and `python -m benchmarks.speed.seed_throughput`.", ""]
    by_name = {suite.name: suite for suite in suites}
    current = [name for name in CURRENT_SUITES if name in by_name]
    for heading, group in (("Current suites", current), ("Other suites", sorted(set(by_name) - set(current)))):
        if group:
            lines += [f"# {heading}", ""]
        for name in group:
            lines += suite_figures(out, name, by_name[name], drawn or out)
    return "\n".join(lines)


def seed_counts(seeds: pd.Series) -> str:
    """n of each preset's curve, once when they are all alike."""
    counts = {int(n) for n in seeds}
    if len(counts) == 1:
        count = counts.pop()
        return f"n = {plural(count, 'seed')}" + (" each" if len(seeds) > 1 else "")
    return "n = " + ", ".join(f"{algo} {int(n)}" for algo, n in seeds.items())


def score_texts(values) -> list[str]:
    """Scores as captions quote them: three significant digits and at least one decimal, more where two different
    values would otherwise read alike (0.834 and 0.677; 2.147 and 2.085; 2022.0)."""
    import math

    values = [float(v) for v in values]

    def text(value: float, digits: int) -> str:
        magnitude = math.floor(math.log10(abs(value))) if value else digits
        return f"{value:.{max(1, digits - 1 - magnitude)}f}"

    for digits in range(3, 10):
        texts = [text(v, digits) for v in values]
        if len(set(texts)) == len(set(values)):
            break
    return texts


def joined(names: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def run_summaries(suite_dir: Path) -> list[dict]:
    """env, algo, seed, dir and config of every complete run of a suite, from its summary.json (no log is read)."""
    from benchmarks.runs import read_summary, why_not_complete

    summaries = []
    for path in sorted(Path(suite_dir).rglob("summary.json")):
        summary = read_summary(path.parent)
        if ".hydra" not in path.parts and why_not_complete(summary) is None and all(
                key in summary for key in ("env", "algo", "seed", "config")):
            summaries.append({key: summary[key] for key in ("env", "algo", "seed", "config")} | {"dir": path.parent})
    return summaries


def task_caption(task: str, rows: pd.DataFrame, metric: str, versus_missing: bool, note: str = "") -> str:
    """One task's figure: n, the highest final mean (every preset tied at it), PPO's, presets whose curves coincide,
    saturation, the note its title carries on its hyperparameters (tuning_note), and why no panels against PPO
    follow where they do not."""
    means = rows["final_mean"].astype(float)
    best = [algo for algo in rows.index if means[algo] == means.max()]
    ppo_apart = "ppo" in rows.index and "ppo" not in best  # PPO's mean quoted beside the best
    quoted = [best[0]] + (["ppo"] if ppo_apart else [])
    texts = dict(zip(quoted, score_texts(means[quoted])))
    head = f"{task}{f' ({metric})' if metric else ''}, {seed_counts(rows['seeds'])}: "
    if len(rows) == 1:
        body = f"final mean {texts[best[0]]}."
    else:
        body = (f"highest final mean {best[0]} {texts[best[0]]}" if len(best) == 1 else
                f"highest final mean, tied at {texts[best[0]]}: {', '.join(best)}")
        body += f"; PPO {texts['ppo']}." if ppo_apart else "."
    if note:
        body += f" {note[0].upper()}{note[1:]}."
    clusters = []
    if "same_eval_as" in rows:
        for algo, others in rows["same_eval_as"].items():
            cluster = sorted({algo, *(others.split() if isinstance(others, str) else [])})
            if len(cluster) > 1 and cluster not in clusters:
                clusters.append(cluster)
    for cluster in clusters:
        body += f" {joined(cluster)} coincide: the same evaluations in every seed."
    if "saturated" in rows and rows["saturated"].astype(bool).any():
        body += (f" {task} saturates: at least half of its runs end within {1 - SATURATED_SCORE:.0%} of the best "
                 f"evaluation any run reached.")
    if versus_missing:
        body += (f" No panels against PPO: fewer than {MIN_SEEDS_FOR_CI} seeds per preset, too few for "
                 f"P(improve over PPO).")
    return head + body


def frontier_caption(task: str, task_runs: list[dict]) -> str:
    """A KL frontier: which presets and KL coefficients it compares, n, and what its panels can show."""
    lines = frontier_lines(task_runs)
    algos = list(dict.fromkeys(algo for algo, _ in lines))
    coefs = sorted({coef for _, coef in lines})
    if len(coefs) > 1:
        compared = "; ".join(
            f"{algo} at KL coefficient{'s' * (len([c for a, c in lines if a == algo]) > 1)} "
            f"{joined([f'{c:g}' + (' (dashed)' if c == 0 else '') for a, c in lines if a == algo])}"
            for algo in algos)
    else:
        compared = f"{joined(algos)} at KL coefficient {coefs[0]:g}"
    counts = {len(group) for group in lines.values()}
    n = (f"n = {plural(counts.pop(), 'seed')} each" if len(counts) == 1 else
         "n = " + ", ".join(f"{algo} {coef:g}: {len(group)}" for (algo, coef), group in lines.items()))
    env = task_runs[0]["config"]["env"]
    points = ("against their KL to the reference, one point per rollout (mean over seeds) from the start (KL 0) to "
              "the end (large marker)")
    if reward_is_judge(task_runs):
        return (f"{task}, {compared}, {n}: the {reward_name(env)} of each rollout's responses {points}. The training "
                f"reward is the judge's own score, so one panel: no reward hacking can show.")
    return (f"{task}, {compared}, {n}: the reward model's score (left) and the {judge_name(env)} (right) of each "
            f"rollout's responses {points}; reward hacking would show as the reward model's score rising while the "
            f"judge's falls.")


def sensitivity_caption(task: str, runs: list[dict]) -> str:
    """A sensitivity heatmap: its preset, grid, seeds and budget, the lowest cell and the cells at the ceiling."""
    algo, cells = sensitivity_grids(runs)[task]
    summary = sensitivity_cells(runs, task, cells)
    sigmas, mus = sorted({k[0] for k in cells}), sorted({k[1] for k in cells})
    seeds = "-".join(map(str, sorted({n for _, n, _ in summary.values()})))
    low = min(summary, key=lambda key: summary[key][0])
    high = max(summary, key=lambda key: summary[key][0])
    ceiling = [key for key, (_, _, at) in summary.items() if at]
    quoted = [low, *(ceiling or [high])]
    texts = dict(zip(quoted, score_texts([summary[key][0] for key in quoted])))
    cell = "sigma {:g}, mu {:g}".format
    text = (f"{task}, {algo}'s final evaluation return (mean of {seeds} seeds, {budget_text(runs)}) for each outer "
            f"learning rate sigma ({', '.join(f'{v:g}' for v in sigmas)}) and Nesterov momentum mu "
            f"({', '.join(f'{v:g}' for v in mus)}): lowest {texts[low]} ({cell(*low)})")
    if ceiling:
        return text + (f"; {plural(len(ceiling), 'cell')} (*) at the ceiling, within {1 - SATURATED_SCORE:.0%} of the "
                       f"best evaluation any run reached, where the grid cannot rank them: "
                       f"{'; '.join(f'{cell(*key)} ({texts[key]})' for key in ceiling)}.")
    return text + f"; highest {texts[high]} ({cell(*high)})."


def suite_figures(out: Path, suite: str, suite_dir: Path, drawn: Path) -> list[str]:
    lines = [f"## {suite}", ""]
    summaries = run_summaries(suite_dir)
    table_path = out / "tables" / f"{suite}.csv"
    if table_path.exists():
        lines += [f"Table: [tables/{suite}.md](tables/{suite}.md).", ""]
        table = pd.read_csv(table_path)
        for task in sorted(table["task"].unique()):
            rows = table[table["task"] == task].set_index("algo")
            task_runs = [run for run in summaries if run["env"] == task]
            metric = axis_names(task_runs)[1] if task_runs and is_token_task(task_runs) else ""
            versus = f"plots/{suite}_{task}_vs_ppo.png"
            compared = [a for a in rows.index if a != "ppo" and rows.loc[a, "seeds"] >= MIN_SEEDS_FOR_CI]
            ppo_seeds = rows.loc["ppo", "seeds"] if "ppo" in rows.index else 0
            versus_missing = len(rows) > 1 and "ppo" in rows.index and not (drawn / versus).exists() and (
                ppo_seeds < MIN_SEEDS_FOR_CI or not compared)
            figure = f"plots/{suite}_{task}.png"
            if (drawn / figure).exists():
                note = tuning_note(task_runs) if task_runs else ""
                lines += [f"![{suite} {task}]({figure})", "",
                          task_caption(task, rows, metric, versus_missing, note), ""]
            if (drawn / versus).exists() and "poi_ci_low" in rows:
                above = [a for a in compared if rows.loc[a, "poi_ci_low"] > 0.5]
                below = [a for a in compared if rows.loc[a, "poi_ci_high"] < 0.5]
                score = "score" if metric else "return"
                left = [a for a in rows.index if a != "ppo" and a not in compared]
                skipped = f" ({', '.join(left)}: fewer than {MIN_SEEDS_FOR_CI} seeds, not drawn)" if left else ""
                lines += [f"![{suite} {task} vs PPO]({versus})", "",
                          f"{task}, P(final {score} > PPO's) with its 95% CI above 0.5: {', '.join(above) or 'none'}; "
                          f"below 0.5: {', '.join(below) or 'none'}{skipped}.", ""]
    aggregate_path = out / "tables" / f"{suite}_aggregate.csv"
    if aggregate_path.exists() and (drawn / "plots" / f"{suite}_aggregate.png").exists():
        agg = pd.read_csv(aggregate_path, keep_default_na=False).set_index("algo")
        best = agg["iqm"].astype(float).idxmax()
        tasks, saturated = agg["task_names"].iloc[0].split(), agg["saturated_tasks"].iloc[0].split()
        above = [a for a in agg.index if a != "ppo" and float(agg.loc[a, "poi_ci_low"]) > 0.5]
        below = [a for a in agg.index if a != "ppo" and float(agg.loc[a, "poi_ci_high"]) < 0.5]
        flag = (f" {', '.join(saturated)} saturate{'s' * (len(saturated) == 1)}: at least half of the runs end "
                f"within {1 - SATURATED_SCORE:.0%} of the best." if saturated else "")
        seeds = int(agg["seeds_per_task"].min())
        lines += [f"![{suite} aggregate](plots/{suite}_aggregate.png)", "",
                  f"{len(tasks)} tasks x {plural(seeds, 'seed')}: highest IQM {best} "
                  f"{float(agg.loc[best, 'iqm']):.3f} [{float(agg.loc[best, 'iqm_ci_low']):.3f}, "
                  f"{float(agg.loc[best, 'iqm_ci_high']):.3f}]; P(improve over PPO) CI above 0.5: "
                  f"{', '.join(above) or 'none'}; below 0.5: {', '.join(below) or 'none'}.{flag}", ""]
        if (drawn / "plots" / f"{suite}_sample_efficiency.png").exists():
            lines += [f"![{suite} sample efficiency](plots/{suite}_sample_efficiency.png)", "",
                      f"The aggregate above at every evaluation: {len(agg)} presets, {len(tasks)} tasks "
                      f"({task_list(tasks, saturated)}) x {plural(seeds, 'seed')}.", ""]
    tasks = sorted(p.name for p in suite_dir.iterdir() if (CONF_ENV / f"{p.name}.yaml").exists())
    for task in tasks:
        if (drawn / "plots" / f"{suite}_{task}_kl_frontier.png").exists():
            task_runs = [run for run in summaries if run["env"] == task and kl_coef(run) is not None]
            lines += [f"![{suite} {task} KL frontier](plots/{suite}_{task}_kl_frontier.png)", "",
                      frontier_caption(task, task_runs), ""]
        if (drawn / "plots" / f"{suite}_{task}_sensitivity.png").exists():
            lines += [f"![{suite} {task} sensitivity](plots/{suite}_{task}_sensitivity.png)", "",
                      sensitivity_caption(task, load_runs(suite_dir / task)), ""]
    return lines


def display_path(suite_dir: Path) -> str:
    """The suite's path as a command line in the repository names it (relative to it when inside)."""
    resolved = Path(suite_dir).resolve()
    root = RESULTS.parent.resolve()
    return str(resolved.relative_to(root)) if resolved.is_relative_to(root) else str(resolved)


def default_out(suite_dir: Path) -> Path:
    """results/ for the committed suites; an ad-hoc sweep's report goes beside its runs, not into the repository."""
    inside = Path(suite_dir).resolve().is_relative_to((RESULTS / "runs").resolve())
    return RESULTS if inside else Path(suite_dir) / "report"


if __name__ == "__main__":
    main()
