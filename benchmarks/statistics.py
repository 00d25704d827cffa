"""The statistics every table and figure uses, in one place, reproducible (fixed random states).

- per (task, preset): percentile-bootstrap CI of the mean over seeds, IQM (25% trimmed mean),
  area under the evaluation curve;
- across tasks: rliable's (Agarwal et al. 2021) stratified-bootstrap interval estimates and
  probability of improvement.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

BOOTSTRAP_RESAMPLES = 2000
MIN_SEEDS_FOR_CI = 5  # fewer seeds: a bootstrap "95% CI" is little more than the seeds' own range


def bootstrap_mean_ci(values: np.ndarray, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean over seeds (rows of `values`; works column-wise for curves)."""
    values = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(values), size=(BOOTSTRAP_RESAMPLES, len(values)))
    means = values[picks].mean(axis=1)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2], axis=0)
    return low, high


def interquartile_mean(values) -> float:
    """The 25% trimmed mean of all values (rliable's IQM; scipy's trim_mean, computed the same way)."""
    return float(trimmed_means(np.ravel(np.asarray(values, dtype=float))[:, None])[0])


def trimmed_means(values: np.ndarray) -> np.ndarray:
    """IQM of each column of a [values, columns] array: scipy.stats.trim_mean(column, 0.25), column by column,
    with its partition and mean, without its per-call overhead (rliable calls it once per bootstrap resample and
    per evaluation point: that was most of the report's time)."""
    count = values.shape[0]
    low = int(0.25 * count)
    high = count - low
    kept = np.partition(values, (low, high - 1), axis=0)[low:high]
    return np.ascontiguousarray(kept.T).mean(axis=1)  # each column summed as a 1-D array is, as scipy sums it


def area_under_curve(curve: pd.Series) -> float:
    steps = curve.index.to_numpy(dtype=float)
    span = steps[-1] - steps[0]
    return float(np.trapezoid(curve.to_numpy(), steps) / span) if span > 0 else float(curve.iloc[-1])


def rliable_estimates(score_dict: dict, func) -> tuple[dict, dict]:
    """rliable's point estimates and stratified-bootstrap 95% CIs, reproducibly.

    rliable's bootstrap classes draw their indices from numpy's global RNG (not
    only from random_state), so both are seeded; arch's deprecation warning for
    random_state is silenced, since random_state is what makes the CIs repeatable.
    """
    import warnings

    from rliable import library as rly

    warnings.filterwarnings("ignore", message="random_state is deprecated", category=FutureWarning)
    np.random.seed(0)
    return rly.get_interval_estimates(score_dict, func, reps=BOOTSTRAP_RESAMPLES,
                                      random_state=np.random.RandomState(0))


def per_preset_estimates(score_dict: dict, func) -> tuple[dict, dict]:
    """rliable_estimates for each preset on its own, each from the same seeded start: a preset's interval depends on
    its own runs only, so adding or removing another preset leaves it unchanged (one bootstrap over the whole dict
    draws each preset's resamples after the previous presets', in the dict's order)."""
    points, intervals = {}, {}
    for name, scores in score_dict.items():
        point, interval = rliable_estimates({name: scores}, func)
        points[name], intervals[name] = point[name], interval[name]
    return points, intervals


def mean_probability_of_improvement(scores_x: np.ndarray, scores_y: np.ndarray) -> float:
    """rliable's metrics.probability_of_improvement, vectorised: per task the Mann-Whitney U of X over Y
    divided by n_x * n_y, i.e. (#pairs x > y + 0.5 #ties) / (n_x n_y); then the mean over tasks.

    rliable calls scipy's mannwhitneyu once per task per bootstrap resample (2000
    resamples): that was 90% of the report's run time. The counts are exact in
    float64, so the values are identical (tests/test_report.py checks it).
    """
    pairs_x, pairs_y = scores_x[:, None, :], scores_y[None, :, :]
    wins = (pairs_x > pairs_y).sum(axis=(0, 1)) + 0.5 * (pairs_x == pairs_y).sum(axis=(0, 1))
    return float(np.mean(wins / (scores_x.shape[0] * scores_y.shape[0])))


def probability_of_improvement(candidate: np.ndarray, baseline: np.ndarray) -> tuple[float, float, float]:
    """P(candidate > baseline) averaged over tasks, with its 95% CI; inputs are [runs x tasks] scores."""
    point, interval = rliable_estimates({"pair": [candidate, baseline]}, mean_probability_of_improvement)
    low, high = np.ravel(interval["pair"])
    return float(point["pair"]), float(low), float(high)


Z95 = 1.959963984540054  # the standard normal's 97.5% quantile: two-sided 95% intervals


def detectable_improvement(seeds: int, tasks: int) -> float:
    """The smallest P(improvement) whose 95% interval excludes 0.5 with this many seeds per side and tasks:
    0.5 + 1.96 x the estimate's standard error when the two presets do not differ. Per task the Mann-Whitney U of
    n against n seeds, divided by n^2, has variance (2n + 1) / (12 n^2) under no difference (no ties; ties only
    shrink what the data can show); the mean over T tasks divides it by T. At 5 seeds and 3 tasks: 0.717."""
    return 0.5 + Z95 * np.sqrt((2 * seeds + 1) / (12 * seeds**2 * tasks))


def detectable_std_ratio(seeds: int, tasks: int) -> float:
    """The largest seed-std ratio below 1 whose 95% interval excludes 1 with this many seeds per side and tasks
    (normal returns): log(s_x / s_y) has variance about 1/(2(n-1)) + 1/(2(n-1)) = 1/(n-1) per task, the mean over T
    tasks 1/((n-1)T), so the ratio must be below exp(-1.96 / sqrt((n-1)T)) (or above its inverse). 5 seeds, 3 tasks:
    0.568. nan where no ratio is: with so few seeds, more than 2.5% of seed_std_ratio's resamples draw one seed n
    times on some task (probability 1 - (1 - n^(1-n))^T per side), a side without spread, so its bounds are 0 and
    infinity whatever the runs (2 or 3 seeds; 4 over 2 tasks or more; 5 over 16 or more)."""
    if 1 - (1 - float(seeds) ** (1 - seeds)) ** tasks > (1 - 0.95) / 2:
        return math.nan
    return float(np.exp(-Z95 / np.sqrt((seeds - 1) * tasks)))


def seed_std_ratio(candidate: np.ndarray, baseline: np.ndarray, seed: int = 0,
                   level: float = 0.95) -> tuple[float, float, float, np.ndarray]:
    """The candidate's seed std over the baseline's, geometric mean over tasks, with a stratified-bootstrap interval:
    each resample draws, within every task, the candidate's seeds and the baseline's seeds with replacement
    (rliable's stratification: runs resampled per task, never across). Inputs are [seeds x tasks] scores; returns
    (point, low, high, per-task ratios). A resample where both sides of a task have no spread counts that task as
    equal (ratio 1); one side without spread gives a ratio of 0 or infinity (clipped to e^-50, e^50 in the resamples'
    mean, and a bound such resamples decide is reported as 0 or infinity); the point estimate and the per-task ratios
    are not clipped (0 or infinity; the point nan where tasks of both kinds meet)."""
    candidate, baseline = np.asarray(candidate, dtype=float), np.asarray(baseline, dtype=float)

    def log_ratios(ours: np.ndarray, theirs: np.ndarray, clip: bool = True) -> np.ndarray:  # [.., seeds, tasks]
        spread_ours, spread_theirs = ours.std(axis=-2), theirs.std(axis=-2)
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.where((spread_ours == 0) & (spread_theirs == 0), 0.0, np.log(spread_ours) - np.log(spread_theirs))
        return np.clip(logs, -50, 50) if clip else logs

    rng = np.random.default_rng(seed)
    columns = np.arange(candidate.shape[1])
    draws = [values[rng.integers(0, len(values), size=(BOOTSTRAP_RESAMPLES, *values.shape)), columns]
             for values in (candidate, baseline)]
    resampled = np.exp(log_ratios(*draws).mean(axis=-1))
    low, high = np.quantile(resampled, [(1 - level) / 2, (1 + level) / 2])
    # Where more resamples than the tail holds have a task whose one side has no spread, that bound is unbounded
    # (0 or infinity), not the clip's e^50: say so instead of printing an arbitrary huge number.
    spread_ours, spread_theirs = draws[0].std(axis=-2), draws[1].std(axis=-2)
    tail = (1 - level) / 2
    if np.mean(((spread_theirs == 0) & (spread_ours > 0)).any(axis=-1)) > tail:
        high = math.inf
    if np.mean(((spread_ours == 0) & (spread_theirs > 0)).any(axis=-1)) > tail:
        low = 0.0
    # The estimate itself unclipped: a task where one side's seeds do not spread has a ratio of 0 or infinity, and
    # so has the geometric mean (undefined, nan, with one of each), not e^(50/T).
    logs = log_ratios(candidate, baseline, clip=False)
    with np.errstate(invalid="ignore"):
        return float(np.exp(logs.mean())), float(low), float(high), np.exp(logs)
