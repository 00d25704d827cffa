"""The CI learning-regression check: every preset against committed reference curves, and proof that it bites.

The references in results/reference/ci come from `python run.py -m +experiment=regression_ci`
(a preset added later: the same command with algo=<preset>). Each (env, algo) held there is
retrained here with the same configs (its seeds as one population) and compared by
benchmarks.regression. The bug tests inject a real learning bug through a test-only monkeypatch
and require a REGRESSION verdict.
"""

import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT, compose_config
from omegaconf import OmegaConf

import algorithms.hp3o
import algorithms.ppo
from algorithms.core import compute_gae
from benchmarks.pack import main as pack_main
from benchmarks.regression import compare
from benchmarks.regression import main as regression_main
from benchmarks.runs import load_runs
from benchmarks.engine.batch_trainer import train_batch

REFERENCE = ROOT / "results" / "reference" / "ci"
EXPERIMENT = OmegaConf.load(ROOT / "conf" / "experiment" / "regression_ci.yaml")
PARAMS = EXPERIMENT.hydra.sweeper.params
ENVS = PARAMS.env.split(",")
# Every preset with reference runs: the experiment's own, and any added with algo=<preset>.
ALGOS = sorted({path.name for env in ENVS for path in (REFERENCE / env).iterdir() if path.is_dir()})
SEEDS = [int(seed) for seed in str(PARAMS.seeds).strip("[]").split(",")]  # one population per (task, preset)
ALPHA, MIN_EFFECT, RESAMPLES = 0.05, 0.2, 10_000  # the command's defaults


@pytest.fixture(autouse=True)
def default_engine_compiled(compiled):
    """The reference was made on the default engine, compiled: the reruns must be too, to match it bit for bit."""


def train_candidates(env: str, algo: str, run_root: Path, *overrides: str) -> list[dict]:
    """The (task, preset)'s seeds as the reference trained them: one population."""
    seeds = ",".join(map(str, SEEDS))
    cfg = compose_config(["+experiment=regression_ci", f"env={env}", f"algo={algo}", f"seeds=[{seeds}]", *overrides])
    train_batch(cfg, [run_root / env / algo / f"seed{seed}" for seed in SEEDS])
    return load_runs(run_root)


def verdicts(env: str, algo: str, candidate_runs: list[dict]) -> pd.DataFrame:
    reference_runs = [r for r in load_runs(REFERENCE) if (r["env"], r["algo"]) == (env, algo)]
    assert len(reference_runs) == len(SEEDS), f"reference runs for {env}/{algo} missing under {REFERENCE}"
    table = compare(reference_runs, candidate_runs, ALPHA, MIN_EFFECT, RESAMPLES)
    print(table.to_string(index=False))
    return table


def assert_reproduces_the_reference_exactly(env: str, algo: str, candidates: list[dict]) -> None:
    """Unchanged code with fixed seeds retrains the committed short runs bit for bit (checked in every cell, beside
    its verdict: the same runs; the reference is made in portable numerics, so on any x86-64 CPU with AVX2)."""
    reference = {r["seed"]: r for r in load_runs(REFERENCE) if (r["env"], r["algo"]) == (env, algo)}
    for run in candidates:
        pd.testing.assert_series_equal(run["eval"]["eval_return_mean"], reference[run["seed"]]["eval"]["eval_return_mean"])


@pytest.mark.slow
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("env", ENVS)
def test_learning_matches_the_reference(env, algo, tmp_path):
    candidates = train_candidates(env, algo, tmp_path)
    table = verdicts(env, algo, candidates)
    assert (table["verdict"] == "ok").all(), table.to_string()
    assert_reproduces_the_reference_exactly(env, algo, candidates)


# --- injected bugs: the check must fail on each ---------------------------------


def flipped_advantage_sign(monkeypatch):
    original = algorithms.ppo.clipped_policy_loss
    monkeypatch.setattr(algorithms.ppo, "clipped_policy_loss",
                        lambda new, old, advantages, clip, mask=None: original(new, old, -advantages, clip, mask))


def clip_range_ignored(monkeypatch):
    original = algorithms.ppo.clipped_policy_loss
    monkeypatch.setattr(algorithms.ppo, "clipped_policy_loss",
                        lambda new, old, advantages, clip, mask=None: original(new, old, advantages, float("inf"), mask))


def truncation_bootstrap_dropped(monkeypatch):
    def gae_treating_truncation_as_termination(rewards, values, next_value, terminated, truncated, valid, *args):
        return compute_gae(rewards, values, next_value, terminated | truncated, truncated, valid, *args)

    for module in (algorithms.ppo, algorithms.hp3o):
        monkeypatch.setattr(module, "compute_gae", gae_treating_truncation_as_termination)


@pytest.mark.slow
@pytest.mark.parametrize(
    "inject, env",
    [(flipped_advantage_sign, "CartPole"), (clip_range_ignored, "Pendulum"), (truncation_bootstrap_dropped, "Pendulum")],
)
def test_check_fails_on_an_injected_bug(inject, env, tmp_path, monkeypatch):
    # injected into the default path (the compiled population engine, which traces PPO's loss terms in this
    # process, so a patched function is what it compiles)
    inject(monkeypatch)
    table = verdicts(env, "ppo", train_candidates(env, "ppo", tmp_path))
    assert (table["verdict"] == "REGRESSION").any(), table.to_string()


def test_command_exits_nonzero_on_a_missing_run(tmp_path, capsys):
    # A candidate with CartPole's runs only: every Pendulum (env, algo) is MISSING.
    import shutil

    shutil.copytree(REFERENCE, tmp_path, dirs_exist_ok=True)  # with the suite's packed logs
    shutil.rmtree(tmp_path / "Pendulum")
    assert regression_main(["--reference", str(REFERENCE), "--candidate", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    presets = len(ALGOS)  # each: 2 CartPole metric rows (ok) and 1 MISSING Pendulum row
    assert "MISSING" in out and f"{presets} failing of {3 * presets} rows" in out


@pytest.mark.parametrize("make_candidate,message", [
    (lambda path: path / "nothing", "does not exist"),
    (lambda path: [(path / "file").write_text("x"), path / "file"][1], "is not a directory"),
    (lambda path: path, "holds no runs (no summary.json or train.csv under it)"),
])
def test_a_candidate_that_is_not_a_directory_of_runs_is_named_as_such(make_candidate, message, tmp_path, capsys):
    candidate = make_candidate(tmp_path)
    assert regression_main(["--reference", str(REFERENCE), "--candidate", str(candidate)]) == 2
    assert capsys.readouterr().err == f"error: --candidate {candidate}: {message}\n"


@pytest.mark.parametrize("arguments, message", [
    (["--alpha", "2"], "argument --alpha: must be a number in (0, 0.5], got 2"),
    (["--resamples", "0"], "argument --resamples: must be an integer in [1, inf), got 0"),
    (["--min-effect", "-1"], "argument --min-effect: must be a number in [0, inf), got -1"),
    (["--tasks", "Cartpole"], "argument --tasks: Cartpole: not in --reference"),
    (["--algos", "ppo", "hp4o"], "argument --algos: hp4o: not in --reference"),
])
def test_a_setting_out_of_range_or_a_misspelt_task_is_refused_in_one_line(arguments, message, capsys):
    with pytest.raises(SystemExit) as stop:
        regression_main(["--reference", str(REFERENCE), "--candidate", str(REFERENCE), *arguments])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        f"python -m benchmarks.regression: error: {message}")


def test_a_variant_of_ones_own_is_selected_by_the_name_its_runs_have(tmp_path, capsys):
    """--algos took conf/algo names only: a module:Class variant with its own algo.name was refused ('no
    conf/algo/my_variant.yaml')."""
    import shutil

    runs = tmp_path / "runs"
    shutil.copytree(REFERENCE, runs)  # (its logs are packed per suite)
    for summary_path in (runs / "CartPole" / "hp3o").rglob("summary.json"):
        summary = json.loads(summary_path.read_text())
        summary["algo"] = summary["config"]["algo"]["name"] = "my_variant"
        summary_path.write_text(json.dumps(summary))
    assert regression_main(["--reference", str(runs), "--candidate", str(runs), "--algos", "my_variant"]) == 0
    assert "0 failing of 2 rows" in capsys.readouterr().out


def test_one_cell_can_be_checked_alone(capsys):
    assert regression_main(["--reference", str(REFERENCE), "--candidate", str(REFERENCE),
                            "--tasks", "CartPole", "--algos", "hp3o"]) == 0
    out = capsys.readouterr().out
    assert "0 failing of 2 rows" in out and "Pendulum" not in out  # its two metrics: AUC, final return


def test_command_passes_the_reference_against_itself(capsys):
    assert regression_main(["--reference", str(REFERENCE), "--candidate", str(REFERENCE)]) == 0
    out = capsys.readouterr().out
    assert "REGRESSION" not in out and "0 failing" in out


# --- the statistics on synthetic curves (no training) --------------------------


def synthetic_runs(finals: list[float], algo="ppo") -> list[dict]:
    runs = []
    for seed, final in enumerate(finals):
        curve = pd.DataFrame({"env_steps": [0, 50, 100], "eval_return_mean": [0.0, final / 2, final]})
        runs.append({"env": "Toy", "algo": algo, "seed": seed, "eval": curve})
    return runs


def test_auc_is_the_mean_return_over_the_curve():
    from benchmarks.regression import curve_metrics

    metrics = curve_metrics(pd.DataFrame({"env_steps": [0, 100, 300], "eval_return_mean": [0.0, 10.0, 10.0]}))
    assert metrics["auc"] == pytest.approx((0.5 * 100 * 10 + 200 * 10) / 300)
    assert metrics["final"] == 10.0 and metrics["first"] == 0.0


def test_clear_drop_is_a_regression_and_noise_is_not():
    reference = synthetic_runs([100.0, 110.0, 90.0])
    collapsed = compare(reference, synthetic_runs([10.0, 12.0, 8.0]), ALPHA, MIN_EFFECT, RESAMPLES)
    assert (collapsed["verdict"] == "REGRESSION").all()
    # 5% lower: significant at n=3 maybe, but under the minimum effect (20% of the reference's progress)
    slightly_lower = compare(reference, synthetic_runs([95.0, 104.0, 86.0]), ALPHA, MIN_EFFECT, RESAMPLES)
    assert (slightly_lower["verdict"] == "ok").all()
    # 5% lower on every seed, with little noise: significant, yet under the minimum effect, so not a regression.
    consistent = synthetic_runs([100.0, 100.5, 99.5])
    small_drop = compare(consistent, synthetic_runs([95.0, 95.5, 94.5]), ALPHA, MIN_EFFECT, RESAMPLES)
    assert (small_drop["upper_bound"].astype(float) < 0).all() and (small_drop["verdict"] == "ok").all()
    # A big but inconsistent drop (one seed collapses) is not significant.
    one_bad_seed = compare(reference, synthetic_runs([100.0, 110.0, 0.0]), ALPHA, MIN_EFFECT, RESAMPLES)
    assert (one_bad_seed["verdict"] == "ok").all()
    # An improvement is never a regression.
    better = compare(reference, synthetic_runs([200.0, 210.0, 190.0]), ALPHA, MIN_EFFECT, RESAMPLES)
    assert (better["verdict"] == "ok").all()


def test_a_candidate_seed_that_failed_makes_its_cell_missing_not_compared_without_it():
    """A population's seed that went non-finite stops alone (its run 'failed'): the others' curves match the
    reference's, but the cell is not passed on them; nor does a lone surviving seed read as a regression."""
    reference = synthetic_runs([100.0, 110.0, 60.0])
    for survivors, absent in ((reference[:2], "2"), (reference[2:], "0, 1")):
        table = compare(reference, survivors, ALPHA, MIN_EFFECT, RESAMPLES)
        assert list(table["verdict"]) == ["MISSING"]
        assert table.attrs["notes"] == [
            f"MISSING Toy ppo: the candidate has {len(survivors)} complete runs, the reference 3 (no complete run of "
            f"seed(s) {absent}): a seed that failed or did not finish is not compared as if it had not been asked"]
    other_seeds = synthetic_runs([0, 0, 0, 100.0, 110.0, 60.0])[3:]  # seeds 3-5: as many runs, compared
    assert set(compare(reference, other_seeds, ALPHA, MIN_EFFECT, RESAMPLES)["verdict"]) == {"ok"}


def test_the_command_fails_when_one_cells_curves_lose_their_progress(tmp_path, capsys):
    """The reference against a copy of itself in which CartPole/ppo never learns: that cell alone is a REGRESSION."""
    import shutil

    candidate = tmp_path / "candidate"
    shutil.copytree(REFERENCE, candidate)
    pack_main(["--unpack", str(candidate)])  # the runs' CSVs, to edit
    for eval_csv in (candidate / "CartPole" / "ppo").rglob("eval.csv"):
        curve = pd.read_csv(eval_csv)
        curve["eval_return_mean"] = curve["eval_return_mean"].iloc[0]  # flat at the untrained policy's return
        curve.to_csv(eval_csv, index=False)
    assert regression_main(["--reference", str(REFERENCE), "--candidate", str(candidate)]) == 1
    lines = [line for line in capsys.readouterr().out.splitlines() if "REGRESSION" in line]
    assert lines and all(line.split()[:2] == ["CartPole", "ppo"] for line in lines), lines


def test_a_candidate_evaluated_on_another_schedule_is_incomparable_not_compared(tmp_path, capsys):
    """Another budget, eval interval or rollout size measures AUC and final return over another horizon: the cell
    fails and a line says where the schedules part, whatever the returns; so does a reference of mixed schedules."""
    def evaluated_at(runs, steps):
        for run in runs:
            run["eval"] = pd.DataFrame({"env_steps": steps, "eval_return_mean": [float(s) for s in steps]})
        return runs

    reference = evaluated_at(synthetic_runs([0.0] * 3), [0, 50, 100])
    for steps, where in (([0, 50, 100, 150], "4 evaluations, at 0 to 150 env steps, the reference 3 evaluations, at 0 "
                                             "to 100 env steps (the same first 3 evaluations)"),
                         ([0, 50], "2 evaluations, at 0 to 50 env steps, the reference 3 evaluations, at 0 to 100 env "
                                   "steps (the same first 2 evaluations)"),
                         ([0, 60, 100], "3 evaluations, at 0 to 100 env steps, the reference 3 evaluations, at 0 to "
                                        "100 env steps (evaluation 2 at 60 against 50)")):
        table = compare(reference, evaluated_at(synthetic_runs([0.0] * 3), steps), ALPHA, MIN_EFFECT, RESAMPLES)
        assert list(table["verdict"]) == ["INCOMPARABLE"]
        assert table.attrs["notes"] == [f"INCOMPARABLE Toy ppo: the candidate has {where}: train it with the "
                                        f"reference's total_steps, rollout size (env.num_envs x env.num_steps) and "
                                        f"eval settings"]
    assert compare(reference, reference, ALPHA, MIN_EFFECT, RESAMPLES).attrs["notes"] == []
    mixed = reference[:2] + evaluated_at(synthetic_runs([0.0]), [0, 100])
    assert compare(mixed, reference, ALPHA, MIN_EFFECT, RESAMPLES).attrs["notes"] == [
        "INCOMPARABLE Toy ppo: the reference's own runs were evaluated at different env steps (3 and 2 evaluations): "
        "remake it"]
    # the command: the reference's CartPole/ppo runs cut after their second evaluation (as a shorter budget would
    # have ended them), the cell's line below the table, exit status 1
    import shutil

    short = tmp_path / "short"
    shutil.copytree(REFERENCE, short)
    pack_main(["--unpack", str(short)])
    for eval_csv in (short / "CartPole" / "ppo").rglob("eval.csv"):
        pd.read_csv(eval_csv).head(2).to_csv(eval_csv, index=False)
    assert regression_main(["--reference", str(REFERENCE), "--candidate", str(short), "--tasks", "CartPole",
                            "--algos", "ppo"]) == 1
    out = capsys.readouterr().out
    assert "INCOMPARABLE CartPole ppo: the candidate has 2 evaluations, at 0 to 2,560 env steps, the reference 9" in out
