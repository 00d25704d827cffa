"""The statistics every table and figure uses, in one place, reproducible (fixed random states).

- per (task, preset): percentile-bootstrap CI of the mean over seeds, IQM (25% trimmed mean),
  area under the evaluation curve;
- across tasks: rliable's (Agarwal et al. 2021) stratified-bootstrap interval estimates and
  probability of improvement.
"""

from __future__ import annotations

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
