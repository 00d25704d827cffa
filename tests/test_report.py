"""The report command on real (tiny) runs: tables, plots, byte-identical regeneration."""

import filecmp

import numpy as np
import pandas as pd
import pytest
from conftest import QUIET, ROOT

from benchmarks.pack import main as pack_main
from benchmarks.statistics import area_under_curve, bootstrap_mean_ci, interquartile_mean
from benchmarks.report import main as report_main
from benchmarks.engine.trainer import train
from tests.commands import run_python


@pytest.mark.slow
def test_report_writes_tables_and_plots_and_regenerates_identically(make_config, tmp_path):
    suite = tmp_path / "runs" / "tiny_suite"
    for algo in ("ppo", "outer_ppo_lr"):
        for seed in (0, 1):
            cfg = make_config(["env=CartPole", f"algo={algo}", f"seed={seed}", "total_steps=2048",
                               "eval.every_steps=1024", "algo.update_epochs=2", *QUIET])
            train(cfg, suite / "CartPole" / algo / f"seed{seed}")
    for out in ("a", "b"):
        report_main([str(suite), "--out", str(tmp_path / out)])
    for name in ("tiny_suite.md", "tiny_suite.csv"):
        assert filecmp.cmp(tmp_path / "a" / "tables" / name, tmp_path / "b" / "tables" / name, shallow=False)
    table = pd.read_csv(tmp_path / "a" / "tables" / "tiny_suite.csv")
    assert list(table["algo"]) == ["outer_ppo_lr", "ppo"] and (table["seeds"] == 2).all()
    assert table.loc[table["algo"] == "ppo", "time_vs_ppo"].iloc[0] == 1.0
    poi = table.loc[table["algo"] == "outer_ppo_lr", "poi_vs_ppo"].iloc[0]
    assert 0.0 <= poi <= 1.0
    for suffix in (".png", ".svg"):
        assert (tmp_path / "a" / "plots" / f"tiny_suite_CartPole{suffix}").stat().st_size > 0
    assert "P(improve over PPO)" in (tmp_path / "a" / "tables" / "tiny_suite.md").read_text()
    # one task and two seeds: no aggregate table or figure (it would be the task's own score, its CI the seeds')
    assert not list((tmp_path / "a").rglob("tiny_suite_aggregate*"))
    assert not list((tmp_path / "a").rglob("tiny_suite_sample_efficiency*"))
    # wall time is measured for timing (benchmarks.speed.throughput), not drawn from runs sharing a machine
    assert not list((tmp_path / "a" / "plots").glob("*wall_time*"))
    # the figure regenerates byte-identically; two seeds per preset get no panels against PPO (5 needed)
    from benchmarks.report import figures_page

    page = figures_page(tmp_path / "a", [suite])  # every figure with its reading, from the tables beside it
    assert "![tiny_suite CartPole](plots/tiny_suite_CartPole.png)" in page and "CartPole, n = 2 seeds each" in page
    assert "_aggregate.png" not in page and "No panels against PPO: fewer than 5 seeds per preset" in page
    assert filecmp.cmp(tmp_path / "a" / "plots" / "tiny_suite_CartPole.png",
                       tmp_path / "b" / "plots" / "tiny_suite_CartPole.png", shallow=False)
    assert not (tmp_path / "a" / "plots" / "tiny_suite_CartPole_vs_ppo.png").exists()
    svg = (tmp_path / "a" / "plots" / "tiny_suite_CartPole.svg").read_text()
    assert "outer_ppo_lr (n=2)" in svg and "unreliable" in svg  # n in the legend, the band's caveat in the title
    assert "#4477aa" in svg  # outer_ppo_lr's colour (ALGO_STYLE)


def test_packed_runs_give_the_same_report_and_pack_deterministically(make_config, tmp_path):
    suite = tmp_path / "runs" / "tiny_suite"
    for seed in (0, 1):
        cfg = make_config(["env=CartPole", "algo=ppo", f"seed={seed}", "total_steps=1024",
                           "eval.every_steps=512", *QUIET])
        train(cfg, suite / "CartPole" / "ppo" / f"seed{seed}")
    unfinished = suite / "CartPole" / "ppo" / "seed9"  # an interrupted run keeps its plain, resumable CSVs
    unfinished.mkdir()
    (unfinished / "train.csv").write_text("iteration\n1\n")
    (unfinished / "summary.json").write_text('{"status": "interrupted"}')
    seed0 = suite / "CartPole" / "ppo" / "seed0"
    (seed0 / ".hydra").mkdir()  # as a job that trained writes it
    (seed0 / ".hydra" / "config.yaml").write_text("seed: 0\n")
    (seed0 / ".hydra" / "hydra.yaml").write_text("hydra:\n  mode: RUN\n")
    (seed0 / ".hydra" / "overrides.yaml").write_text("- seed=0\n")
    report_main([str(suite), "--out", str(tmp_path / "plain")])
    train_csv = (seed0 / "train.csv").read_bytes()

    pack_main([str(suite)])
    assert not [p.name for p in seed0.iterdir() if p.name.endswith((".csv", ".gz"))]  # summary.json stays
    assert sorted(p.name for p in (seed0 / ".hydra").iterdir()) == ["config.yaml", "overrides.yaml"]
    assert sorted(p.name for p in (suite / "logs").iterdir()) == ["episodes.parquet", "eval.parquet", "train.parquet"]
    assert (unfinished / "train.csv").exists()  # left as it was
    packed_bytes = (suite / "logs" / "train.parquet").read_bytes()
    (seed0 / "train.csv").write_bytes(train_csv)  # the run's CSV again: packing again stores the same rows
    pack_main([str(suite)])
    assert (suite / "logs" / "train.parquet").read_bytes() == packed_bytes  # same logs, same bytes: no spurious diffs

    report_main([str(suite), "--out", str(tmp_path / "packed")])
    for name in ("tiny_suite.md", "tiny_suite.csv"):
        assert filecmp.cmp(tmp_path / "plain" / "tables" / name, tmp_path / "packed" / "tables" / name, shallow=False)


def test_sensitivity_sweep_gives_a_heatmap(make_config, tmp_path, capsys):
    suite = tmp_path / "runs" / "sensitivity"
    for sigma in (0.5, 1.0):
        for mu in (0.0, 0.3):
            cfg = make_config(["env=CartPole", "algo=outer_ppo_nesterov", f"algo.outer_optimizer.lr={sigma}",
                               f"algo.outer_optimizer.momentum={mu}", "total_steps=512", *QUIET])
            train(cfg, suite / f"sigma{sigma}_mu{mu}")
    report_main([str(suite), "--out", str(tmp_path / "out")])
    assert (tmp_path / "out" / "plots" / "sensitivity_CartPole_sensitivity.png").stat().st_size > 0
    # another preset beside the grid is named as left out (its runs vanished unsaid)
    train(make_config(["env=CartPole", "algo=ppo", "total_steps=512", *QUIET]), suite / "ppo")
    capsys.readouterr()
    report_main([str(suite), "--out", str(tmp_path / "out")])
    assert "left out (a sensitivity suite reports its grid): CartPole/ppo" in capsys.readouterr().out
    # a cell holding runs of two configurations is refused (they were averaged as the cell's seeds)
    train(make_config(["env=CartPole", "algo=outer_ppo_nesterov", "algo.outer_optimizer.lr=0.5",
                       "algo.outer_optimizer.momentum=0.0", "algo.ent_coef=0.01", "total_steps=512", *QUIET]),
          suite / "sigma0.5_mu0.0_ent0.01")
    with pytest.raises(SystemExit):
        report_main([str(suite), "--out", str(tmp_path / "out")])
    assert (f"sensitivity: not reported: CartPole/outer_ppo_nesterov holds runs of more than one configuration "
            f"({suite / 'sigma0.5_mu0.0'} and {suite / 'sigma0.5_mu0.0_ent0.01'} differ in: algo.ent_coef): a figure "
            f"over algo.outer_optimizer.lr, algo.outer_optimizer.momentum takes the seeds of one configuration at "
            f"each of its points") in capsys.readouterr().out


def test_bootstrap_ci_and_iqm_on_known_values():
    low, high = bootstrap_mean_ci([5.0, 5.0, 5.0])
    assert low == high == 5.0
    low, high = bootstrap_mean_ci([0.0, 10.0])
    assert 0.0 <= low < 5.0 < high <= 10.0
    assert interquartile_mean([1, 2, 3, 4, 100, 5, 6, 7]) == 4.5  # middle half of 1..7,100


def test_iqm_is_scipys_quarter_trimmed_mean_the_bootstrap_interval_95_percent_wide_and_the_area_per_step():
    """On skewed samples, where trimming another share moves the mean; the interval's half width against the normal
    approximation's 1.96 standard errors (a 90% interval is 16% narrower)."""
    from scipy.stats import trim_mean

    rng = np.random.default_rng(0)
    for count in (4, 5, 10, 33):
        values = rng.exponential(size=count)
        assert interquartile_mean(values) == pytest.approx(trim_mean(values, 0.25), rel=1e-12), count
    values = rng.normal(size=400)
    low, high = bootstrap_mean_ci(values)
    standard_error = values.std(ddof=1) / np.sqrt(len(values))
    assert (high - low) / 2 == pytest.approx(1.959964 * standard_error, rel=0.08)
    assert low < values.mean() < high
    # the area under a curve, per env step of its span (a curve evaluated from step 100 on)
    curve = pd.Series([0.0, 10.0, 10.0], index=[100, 200, 400])
    assert area_under_curve(curve) == pytest.approx((0.5 * 100 * 10 + 200 * 10) / 300)


def test_report_skips_failed_partial_and_corrupt_runs_and_says_why(make_config, tmp_path, capsys):
    import json
    import shutil

    from benchmarks.reproduce import runs_to_check

    suite = tmp_path / "runs" / "mixed"
    good = suite / "CartPole" / "ppo" / "seed0"
    train(make_config(["env=CartPole", "algo=ppo", "total_steps=1024", "eval.every_steps=512", *QUIET]), good)
    for name in ("seed1", "seed2", "seed3", "seed4", "seed5", "seed6", "seed7", "seed8", "seed9", "seed10", "seed11"):
        shutil.copytree(good, good.parent / name)
    (good.parent / "seed1" / "summary.json").write_text(json.dumps({"status": "failed", "error": "NonFiniteError: x"}))
    (good.parent / "seed2" / "summary.json").unlink()  # killed: resumable
    (good.parent / "seed3" / "summary.json").write_text('{"status": "comp')  # torn write
    (good.parent / "seed4" / "eval.csv").unlink()
    (good.parent / "seed5" / "summary.json").write_text('{"status": "complete"}')  # what the readers need is gone
    (good.parent / "seed6" / "summary.json").write_text("[1, 2, 3]")
    with (good.parent / "seed7" / "train.csv").open("a") as log:
        log.write("garbage,rows\nmore,garbage,here\n")
    (good.parent / "seed8" / "train.csv").write_text("something else entirely\n1\n")
    with (good.parent / "seed9" / "eval.csv").open("a") as log:
        log.write("x,y,z\n")
    summary = json.loads((good / "summary.json").read_text())
    del summary["config"]["env"]  # the keys every reader of a run's config takes
    (good.parent / "seed10" / "summary.json").write_text(json.dumps(summary))
    (good.parent / "seed11" / "summary.json").write_text(json.dumps({**summary, "config": "not a mapping"}))
    with (good / "eval.csv").open("a") as log:
        log.write("1536,3,0.5,20")  # a half-written last row is dropped, not a reason to skip
    report_main([str(suite), "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert "skipped CartPole/ppo/seed1: failed: NonFiniteError: x" in out
    # the table's file says what it leaves out too (on the console alone, its means read as of every seed)
    written = (tmp_path / "out" / "tables" / "mixed.md").read_text()
    assert "\nleft out: CartPole/ppo/seed1: failed: NonFiniteError: x\n" in written
    assert "\nleft out: CartPole/ppo/seed2: partial: no summary.json (running, or killed" in written
    assert "skipped CartPole/ppo/seed2: partial: no summary.json" in out
    assert "skipped CartPole/ppo/seed3: corrupt summary.json (JSONDecodeError)" in out
    assert "skipped CartPole/ppo/seed4: corrupt logs (FileNotFoundError" in out
    assert "skipped CartPole/ppo/seed5: corrupt summary.json (missing env, algo, seed" in out
    assert "skipped CartPole/ppo/seed6: corrupt summary.json (not a mapping)" in out
    assert "skipped CartPole/ppo/seed7: corrupt logs (ValueError: train.csv: column env_steps is not numeric" in out
    assert "skipped CartPole/ppo/seed8: corrupt logs (ValueError: train.csv lacks env_steps" in out
    assert "skipped CartPole/ppo/seed9: corrupt logs (ValueError: eval.csv: column env_steps is not numeric" in out
    assert "skipped CartPole/ppo/seed10: corrupt summary.json (its config has no env.name, env.id, env.family)" in out
    assert ("skipped CartPole/ppo/seed11: corrupt summary.json (its config has no env.name, env.id, env.family, "
            "algo.name, algo.algorithm)") in out
    assert "mixed: 1 runs" in out
    with pytest.raises(ValueError, match=r"seed10: corrupt summary.json \(its config has no env.name, env.id, "
                                         r"env.family\): only a complete run is reproduced"):
        runs_to_check([good.parent / "seed10"], one_per_preset=False)  # python -m benchmarks.reproduce <run>
    with pytest.raises(ValueError, match="seed1: failed: NonFiniteError: x: only a complete run is reproduced"):
        runs_to_check([good.parent / "seed1"], one_per_preset=False)


def test_a_suite_with_no_complete_run_is_not_reported_and_the_command_fails(tmp_path, capsys):
    """As summarize does (exit 1): the report said 'no complete runs, skipped' and exited 0, which a script took
    for a report made."""
    suite = tmp_path / "runs" / "empty"
    (suite / "CartPole" / "ppo" / "seed0").mkdir(parents=True)  # a run killed before its first summary
    with pytest.raises(SystemExit) as refused:
        report_main([str(suite), "--out", str(tmp_path / "out")])
    assert str(refused.value) == "error: not reported: empty (above: why)"
    assert f"empty: not reported: no complete runs under {suite}" in capsys.readouterr().out


def test_a_run_that_finishes_no_training_episode_is_reported_packed_or_not(make_config, tmp_path, capsys):
    """A budget shorter than the task's episodes (MountainCar's last 200 steps): episodes.csv holds its header alone,
    and the report reads the run, its last-100 training metric empty; so too an episodes.csv left empty by such a
    run made before the header was written, and the suite packed. An empty episodes.csv where train.csv counts
    finished episodes is a lost log: skipped."""
    import json
    import shutil

    suite = tmp_path / "runs" / "short"
    run = suite / "MountainCar" / "ppo" / "seed0"
    train(make_config(["env=MountainCar", "algo=ppo", "env.num_envs=1", "env.num_steps=64", "total_steps=128",
                       *QUIET]), run)
    assert (run / "episodes.csv").read_text() == "env_steps,episode_return,episode_length\n"
    for seed in (1, 2):
        shutil.copytree(run, run.parent / f"seed{seed}")
        summary = json.loads((run.parent / f"seed{seed}" / "summary.json").read_text())
        (run.parent / f"seed{seed}" / "summary.json").write_text(json.dumps({**summary, "seed": seed}))
    (run.parent / "seed1" / "episodes.csv").write_text("")
    # seed 2's train.csv counts a finished episode its episodes.csv lacks: a log lost, not a short run
    train_log = pd.read_csv(run.parent / "seed2" / "train.csv")
    train_log.loc[0, "episodes"] = 1
    train_log.to_csv(run.parent / "seed2" / "train.csv", index=False)
    for out, packed in (("plain", False), ("packed", True)):
        if packed:
            pack_main([str(suite)])
            assert not (run / "episodes.csv").exists()
        report_main([str(suite), "--out", str(tmp_path / out)])
        printed = capsys.readouterr().out
        assert "short: 2 runs" in printed and printed.count("skipped") == 1
        assert ("skipped MountainCar/ppo/seed2: corrupt logs (ValueError: episodes.csv has no rows, yet train.csv "
                "counts 1 finished episodes)") in printed
        table = pd.read_csv(tmp_path / out / "tables" / "short.csv")
        assert len(table) == 1 and table["last100_train_mean"].isna().all() and table["seeds"].iloc[0] == 2
    assert filecmp.cmp(tmp_path / "plain" / "tables" / "short.csv", tmp_path / "packed" / "tables" / "short.csv",
                       shallow=False)


def test_vectorised_probability_of_improvement_equals_rliables():
    import numpy as np
    from rliable import metrics

    from benchmarks.statistics import mean_probability_of_improvement

    rng = np.random.default_rng(0)
    for runs_x, runs_y, tasks in [(3, 3, 1), (5, 3, 4), (2, 7, 3)]:
        # Rounded scores: ties between and within algorithms, the case rank-based U must get right.
        x = rng.integers(0, 4, size=(runs_x, tasks)).astype(float)
        y = rng.integers(0, 4, size=(runs_y, tasks)).astype(float)
        assert mean_probability_of_improvement(x, y) == metrics.probability_of_improvement(x, y)
        assert mean_probability_of_improvement(x, x) == 0.5


def test_a_run_writes_its_hyperparameters_and_final_return_for_tensorboards_hparams_view(make_config, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    cfg = make_config(["env=CartPole", "algo=outer_ppo_lr", "total_steps=1024", "eval.every_steps=1024",
                       "eval.episodes=1", "logging.progress_bar=false"])
    train(cfg, tmp_path / "run")
    events = EventAccumulator(str(tmp_path / "run" / "tb"))
    events.Reload()
    content = events.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["algo"].string_value == "outer_ppo_lr" and start.hparams["seed"].number_value == 0
    assert start.hparams["algo.outer_optimizer.lr"].number_value == cfg.algo.outer_optimizer.lr
    assert "hparams/final_eval_return_mean" in events.Tags()["scalars"]


@pytest.mark.slow
def test_a_report_of_ones_own_sweep_names_its_exact_command_and_stays_beside_its_runs(tmp_path):
    import sys

    from conftest import ROOT

    sweep = tmp_path / "my_sweep"
    command = ["-m", "algo=ppo,outer_ppo_lr", "env=CartPole", "seed=0,1", "total_steps=1024", "eval.every_steps=512",
               "eval.episodes=1", "logging.progress_bar=false", "logging.tensorboard=false"]
    result = run_python([sys.executable, str(ROOT / "run.py"), *command, f"hydra.sweep.dir={sweep}"],
                        cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    report_main([str(sweep)])
    table = (sweep / "report" / "tables" / "my_sweep.md").read_text()
    assert "Made by `python run.py -m algo=ppo,outer_ppo_lr env=CartPole seed=0,1 total_steps=1024" in table
    assert f"table by `python -m benchmarks.report {sweep}`" in table
    assert (sweep / "report" / "plots" / "my_sweep_CartPole.png").exists()


def test_a_suite_filled_by_several_sweeps_says_its_command_made_only_part_of_it(tmp_path):
    """multirun.yaml is the last sweep's: `algo=ppo` then `algo=ppo_kl` into one directory named the second alone
    as what made the table of both."""
    from omegaconf import OmegaConf

    from benchmarks.report import made_by

    OmegaConf.save({"hydra": {"overrides": {"task": ["env=CartPole,Acrobot", "algo=ppo_kl", "seed=0,1"],
                                            "hydra": [f"hydra.sweep.dir={tmp_path}"]}}}, tmp_path / "multirun.yaml")
    runs = [{"env": env, "algo": algo, "config": {"env": {"name": env}}}
            for env in ("CartPole", "Acrobot") for algo in ("ppo", "ppo_kl")]
    command = f"python run.py -m env=CartPole,Acrobot algo=ppo_kl seed=0,1 hydra.sweep.dir={tmp_path}"
    assert made_by(tmp_path, runs) == (f"`{command}` and earlier commands into the same directory (its runs of "
                                       f"algo ppo)")
    assert made_by(tmp_path, [run for run in runs if run["algo"] == "ppo_kl"]) == f"`{command}`"
    # Hydra's own readings: a list with a space, a quoted value; a renamed preset is the sweep's own
    for task in (["env=CartPole,Acrobot", "algo=ppo, ppo_kl"], ["env=CartPole,Acrobot", "algo='ppo',ppo_kl"],
                 ["env=CartPole,Acrobot", "algo=ppo", "algo.algorithm=mine:Mine", "algo.name=ppo_kl"]):
        OmegaConf.save({"hydra": {"overrides": {"task": task, "hydra": []}}}, tmp_path / "multirun.yaml")
        assert " and earlier commands" not in made_by(tmp_path, runs), task


def test_a_sweeps_command_keeps_an_interpolated_subdir_as_typed_and_quoted_for_the_shell(tmp_path):
    """A sweep given its own hydra.sweep.subdir (docs/configuration.md) holds ${...} in its overrides: the
    command is rebuilt as typed (it ended in OmegaConf's UnsupportedInterpolationType traceback)."""
    from omegaconf import OmegaConf

    from benchmarks.report import suite_command

    subdir = 'hydra.sweep.subdir="${env.name}/${algo.name}/${hydra:job.override_dirname}/${seed_dir:${seed},${seeds}}"'
    OmegaConf.save({"hydra": {"overrides": {
        "hydra": ["hydra.sweep.dir=/tmp/lr_sweep", subdir, "hydra.mode=MULTIRUN", "hydra/launcher=joblib"],
        "task": ["env=CartPole", "seed=0,1", "algo.lr=0.001,0.0003", "seeds=[0,1]"]}}}, tmp_path / "multirun.yaml")
    assert suite_command(tmp_path) == (f"python run.py -m env=CartPole seed=0,1 algo.lr=0.001,0.0003 'seeds=[0,1]' "
                                       f"hydra.sweep.dir=/tmp/lr_sweep '{subdir}'")


def fake_run(env: str, algo: str, seed: int, steps: list[int], returns: list[float]) -> dict:
    return {"env": env, "algo": algo, "seed": seed,
            "eval": pd.DataFrame({"env_steps": steps, "eval_return_mean": returns}),
            "episodes": pd.DataFrame({"episode_return": returns})}


def test_iqm_sample_efficiency_points_are_the_iqm_of_normalised_scores_at_each_evaluation():
    import numpy as np

    from benchmarks.report import normalised_curves, random_score

    runs = [fake_run(task, algo, seed, [0, 1000, 2000], [seed * 7.0 + i * 40 + (algo == "ppo") * 9 for i in range(3)])
            for task in ("CartPole", "Acrobot") for algo in ("ppo", "hp3o") for seed in range(4)]
    curves, x, label, tasks = normalised_curves(runs)
    assert label == "env steps" and list(x) == [0, 1000, 2000] and tasks == ["Acrobot", "CartPole"]
    assert curves["ppo"].shape == (4, 2, 3)  # seeds x tasks x evaluations
    best = 3 * 7.0 + 80 + 9  # the highest evaluation of any run on the task: ppo's seed 3 at the end
    expected = (np.array([seed * 7.0 + 80 + 9 for seed in range(4)]) - random_score("CartPole")) / (
        best - random_score("CartPole"))
    np.testing.assert_allclose(curves["ppo"][:, 1, 2], expected)
    assert max(c.max() for c in curves.values()) == 1.0  # no normalised score exceeds the best run's
    # tasks evaluated at different steps: curves on fractions of each task's budget
    runs[0]["eval"]["env_steps"] = [0, 500, 1000]
    for run in runs:
        if run["env"] == "CartPole":
            run["eval"]["env_steps"] = [0, 500, 1000]
    _, x, label, _ = normalised_curves(runs)
    assert label == "fraction of the env-step budget" and x[0] == 0 and x[-1] == 1
    # a preset first evaluated at mid-budget (eval.at_start=false): no point of any curve is drawn before that
    # (its first point was carried back flat to 0)
    for run in runs:
        if run["algo"] == "hp3o":
            run["eval"] = run["eval"].iloc[1:].reset_index(drop=True)
    _, x, _, _ = normalised_curves(runs)
    assert x[0] == 0.5 and x[-1] == 1


def test_an_aggregate_covers_every_task_and_is_made_only_from_two_tasks_and_five_seeds():
    from benchmarks.report import aggregate_scope, aggregate_table

    def suite(tasks, seeds):
        return [fake_run(task, algo, seed, [0, 1000], [0.0, 1000.0 + 100 * seed + 50 * (algo == "ppo")])
                for task in tasks for algo in ("ppo", "hp3o") for seed in range(seeds)]

    # Walker2d and Humanoid have no reference score: the rule needs none, so they are in
    table = aggregate_table(suite(["HalfCheetah", "Hopper", "Walker2d", "Humanoid"], 5))
    assert table.attrs["tasks"] == ["HalfCheetah", "Hopper", "Humanoid", "Walker2d"] and (table["tasks"] == 4).all()
    assert aggregate_table(suite(["HalfCheetah"], 5)) is None
    assert aggregate_scope(suite(["HalfCheetah"], 5))[2] == "1 task (an aggregate needs 2)"
    assert aggregate_table(suite(["HalfCheetah", "Hopper"], 4)) is None
    assert aggregate_scope(suite(["HalfCheetah", "Hopper"], 4))[2] == "4 seeds per task (an aggregate needs 5)"
    # two tasks, but no preset ran both (or one ran both with another number of seeds on each)
    apart = [run for run in suite(["HalfCheetah", "Hopper"], 5) if (run["algo"] == "ppo") == (run["env"] == "Hopper")]
    uneven = [run for run in suite(["HalfCheetah", "Hopper"], 6) if run["env"] == "Hopper" or run["seed"] < 5]
    for runs in (apart, uneven):
        assert aggregate_table(runs) is None
        assert aggregate_scope(runs)[2] == ("no preset ran all 2 tasks it can normalise with one number of seeds on "
                                            "each (an aggregate compares presets over the same tasks)")
    # two tasks, one of which no run beat a uniform-random policy on: it cannot be normalised
    below_random = suite(["HalfCheetah", "Hopper"], 5)
    for run in below_random:
        if run["env"] == "Hopper":
            run["eval"]["eval_return_mean"] = run["eval"]["eval_return_mean"] * 0 - 1e6
    assert aggregate_table(below_random) is None
    assert aggregate_scope(below_random)[2] == ("1 of its 2 tasks can be normalised (an aggregate needs 2; Hopper (no "
                                                "run above its random_score))")
    # two tasks, but a preset trained another budget on one of them: no comparison under the protocol
    unequal = suite(["HalfCheetah", "Hopper"], 5)
    for run in unequal:
        if run["env"] == "Hopper" and run["algo"] == "hp3o":
            run["eval"]["env_steps"] = [0, 2000]
    assert aggregate_table(unequal) is None
    assert aggregate_scope(unequal)[2] == ("presets trained different budgets on Hopper (hp3o 2,000, ppo 1,000 env "
                                           "steps) (an aggregate compares equal ones)")


def test_a_preset_an_aggregate_leaves_out_is_named_with_why_ppo_included():
    """Five more PPO seeds on one task, or a preset that skipped a task: the aggregate is made of the others, and
    says whom it left out and why (PPO left out also takes P(improve over PPO) away)."""
    from benchmarks.report import aggregate_markdown, aggregate_table

    runs = [fake_run(task, algo, seed, [0, 1000], [0.0, 1000.0 + 100 * seed + 50 * (algo == "ppo")])
            for task in ("HalfCheetah", "Hopper") for algo in ("ppo", "hp3o", "hp3o_plus") for seed in range(5)]
    runs += [fake_run("Hopper", "ppo", seed, [0, 1000], [0.0, 1000.0 + 100 * seed]) for seed in range(5, 10)]
    runs = [run for run in runs if (run["algo"], run["env"]) != ("hp3o_plus", "HalfCheetah")]
    table = aggregate_table(runs)
    assert list(table["algo"]) == ["hp3o"] and "poi_vs_ppo" not in table
    assert table.attrs["left_out"] == ["hp3o_plus (no run of HalfCheetah)",
                                       "ppo (5 seeds on HalfCheetah, 10 seeds on Hopper)"]
    text = aggregate_markdown(table, "s")
    assert ("Left out, as an aggregate compares presets over the same tasks with one number of seeds on each: "
            "hp3o_plus (no run of HalfCheetah), ppo (5 seeds on HalfCheetah, 10 seeds on Hopper).") in text
    assert "best return); no probability of improvement over PPO, which is left out.\n\n|" in text


def test_a_preset_trained_for_another_budget_than_ppo_is_not_compared_with_it_in_the_table(monkeypatch):
    from benchmarks import report

    monkeypatch.setattr(report, "wall_time_per_step", lambda run: 1e-3)  # the fake runs have no train.csv
    runs = [fake_run("CartPole", algo, seed, [0, steps], [10.0, 100.0 + seed + 50 * (algo == "ppo")])
            for algo, steps in (("ppo", 2048), ("hp3o", 1024), ("ppo_kl", 2048)) for seed in range(5)]
    table = report.suite_table(runs)
    shown = table.set_index("algo")
    assert pd.isna(shown.loc["hp3o", "poi_vs_ppo"]) and shown.loc["ppo_kl", "poi_vs_ppo"] == 0.0
    assert "| not compared: PPO trained 2,048 env steps |" in report.markdown(table, "mix", "python run.py -m ...")


def test_an_area_under_a_curve_evaluated_at_other_steps_than_ppos_is_marked(monkeypatch):
    """The same returns from 1,024 env steps on, without the evaluation at the start: a larger area (the mean over
    other points), which the table put beside PPO's unmarked."""
    from benchmarks import report

    monkeypatch.setattr(report, "wall_time_per_step", lambda run: 1e-3)  # the fake runs have no train.csv
    runs = [fake_run("CartPole", "ppo", seed, [0, 1024, 2048], [10.0, 50.0, 100.0 + seed]) for seed in range(5)]
    runs += [fake_run("CartPole", "mine", seed, [1024, 2048], [50.0, 100.0 + seed]) for seed in range(5)]
    runs += [fake_run("CartPole", "ppo_kl", seed, [0, 1024, 2048], [10.0, 50.0, 100.0 + seed]) for seed in range(5)]
    shown = report.markdown(report.suite_table(runs), "mix", "python run.py -m ...")
    assert shown.count("(evaluated at other env steps than PPO)") == 1
    assert "| mine " in [line for line in shown.splitlines() if "other env steps" in line][0]


def test_a_presets_aggregate_interval_does_not_move_when_another_preset_joins_the_suite():
    from benchmarks.report import aggregate_table

    def runs(algos):  # ppo holds each task's best return, so a preset joining below it changes no normalisation
        return [fake_run(task, algo, seed, [0, 1000], [0.0, 900.0 + 20 * seed * (1 + rank) + 300 * (algo == "ppo")])
                for task in ("HalfCheetah", "Hopper") for rank, algo in enumerate(algos) for seed in range(5)]

    columns = ["iqm", "iqm_ci_low", "iqm_ci_high", "mean", "mean_ci_low", "mean_ci_high"]
    alone = aggregate_table(runs(["ppo", "hp3o"])).set_index("algo")[columns]
    joined = aggregate_table(runs(["ppo", "hp3o", "hp3o_plus"])).set_index("algo")[columns]
    assert joined.loc[["hp3o", "ppo"]].equals(alone.loc[["hp3o", "ppo"]])
    assert not joined.loc["hp3o_plus"].equals(joined.loc["hp3o"])


def test_a_task_where_most_runs_reach_the_best_is_flagged_saturated_where_the_aggregate_shows_it(monkeypatch, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import benchmarks.report as report

    runs = [{**fake_run(task, algo, seed, [0, 1000], [20.0, final]), "config": {"total_steps": 1000}}
            for algo in ("ppo", "hp3o") for seed in range(5)
            for task, final in (("CartPole", 500.0), ("Acrobot", -400.0 + 60 * seed + 30 * (algo == "ppo")))]
    table = report.aggregate_table(runs)
    assert table.attrs["saturated"] == ["CartPole"]
    assert "Saturated (at least half of the runs end within 2% of the best" in report.aggregate_markdown(table, "s")
    drawn = []
    monkeypatch.setattr(report, "save_figure", lambda fig, stem, **_: drawn.append(fig) or [stem])
    report.plot_aggregate(table, runs, "s", tmp_path)
    report.plot_sample_efficiency(runs, "s", tmp_path)
    aggregate, efficiency = drawn
    assert "CartPole (saturated)" in aggregate._suptitle.get_text()
    assert "CartPole (saturated)" in efficiency.axes[0].get_title()
    for ax in aggregate.axes[:3]:  # IQM, mean, P(improve): intervals drawn from 0, so a bar at 0 shows
        assert -0.05 <= ax.get_xlim()[0] <= 0.0 and ax.get_xlim()[1] >= 1.0
    assert [t.get_text() for t in aggregate.axes[0].get_yticklabels()] == ["ppo (n=5 x 2)", "hp3o (n=5 x 2)"]
    assert {t.get_text() for t in efficiency.axes[0].get_legend().get_texts()} == {"ppo (n=5 x 2)", "hp3o (n=5 x 2)"}


def test_token_task_curves_are_drawn_in_generated_tokens_and_their_own_metric(monkeypatch, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import benchmarks.report as report

    def runs_of(task, reward):
        env = {"id": f"benchmarks.rlhf.env:RLHF/{task}-v0", "name": f"RLHF{task}", "family": "rlhf",
               "kwargs": {"reward": reward, "autoreset": "same_step"}}
        return [{**fake_run(f"RLHF{task}", algo, seed, [0, 8192], [0.3, 0.9]),
                 "config": {"env": env, "total_steps": 65536}} for algo in ("ppo", "hp3o") for seed in range(2)]

    drawn = []
    monkeypatch.setattr(report, "save_figure", lambda fig, stem, **_: drawn.append(fig) or [stem])
    report.plot_suite(runs_of("Arithmetic", "judge") + runs_of("Praise", "model"), "rlhf", tmp_path)
    arithmetic, praise = (fig.axes[0] for fig in drawn)
    assert arithmetic.get_xlabel() == praise.get_xlabel() == "generated tokens"
    assert arithmetic.get_ylabel() == "fraction right of greedy responses"
    assert praise.get_ylabel() == "reward model's score of greedy responses"
    assert "RLHF/Arithmetic-v0, 65,536 tokens" in arithmetic.get_title() and "benchmarks.rlhf" not in arithmetic.get_title()
    drawn.clear()
    report.plot_versus_ppo(runs_of("Arithmetic", "judge"), "rlhf", tmp_path)
    assert drawn[0].axes[0].get_xlabel() == "generated tokens"
    # runs made with a no-op step per finished response (no autoreset key): their steps are not all tokens
    older = runs_of("Arithmetic", "judge")
    for run in older:
        run["config"]["env"]["kwargs"] = {"reward": "judge"}
    drawn.clear()
    report.plot_suite(older, "rlhf", tmp_path)
    assert drawn[0].axes[0].get_xlabel() == "env steps (generated tokens, a no-op step per response)"
    assert "65,536 env steps" in drawn[0].axes[0].get_title()


def test_long_titles_are_wrapped_to_their_figure_and_saved_unclipped(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    from benchmarks.report import save_figure, wrapped

    title = wrapped("a title far longer than its figure is wide " * 6, 4.0)
    assert all(len(line) <= 4.0 * 72 / (0.55 * 9) for line in title.splitlines()) and title.count("\n") >= 3
    fig, ax = plt.subplots(figsize=(4.0, 3.0))
    ax.plot([0, 1], [0, 1], label="a legend outside the axes")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("x" * 200, fontsize=9)  # unwrapped: wider than the figure
    save_figure(fig, tmp_path / "wide", suffixes=(".png",), dpi=100)
    with Image.open(tmp_path / "wide.png") as image:
        assert image.width > 4.0 * 100  # the canvas grew to hold the title and the legend instead of cutting them


def test_a_published_number_is_drawn_only_at_its_budget_beside_the_same_metric():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks.report import draw_published, published_references

    at_budget = [fake_run("HalfCheetah", "ppo", seed, [0, 999424], [0.0, 1500.0 + seed]) for seed in range(3)]
    rows = published_references(at_budget)
    assert [(r["task"], r["metric"], r["mean"]) for r in rows] == [("HalfCheetah", "last100_train", 1442.64)]
    assert published_references([fake_run("HalfCheetah", "ppo", 0, [0, 300000], [0.0, 1.0])]) == []
    assert published_references([fake_run("HalfCheetah", "hp3o", 0, [0, 999424], [0.0, 1.0])]) == []
    fig, ax = plt.subplots()
    assert draw_published(ax, at_budget) == 2
    labels = [text.get_text() for text in ax.legend().get_texts()]
    assert any("last-100 training episodes 1442.6 +- 46.0" in label for label in labels)
    assert any(label.startswith("ppo here (3 seeds), same metric:") for label in labels)
    plt.close(fig)


def test_every_shipped_preset_has_its_own_colour_and_marker_and_any_other_a_stable_spare():
    from conftest import ROOT

    from benchmarks.report import ALGO_STYLE, SPARE_STYLES, algo_style

    presets = sorted(path.stem for path in (ROOT / "conf" / "algo").glob("*.yaml"))
    assert set(presets) == set(ALGO_STYLE)
    colours, markers = [c for c, _ in ALGO_STYLE.values()], [m for _, m in ALGO_STYLE.values()]
    assert len(set(colours)) == len(colours) and len(set(markers)) == len(markers)
    assert not {c for c, _ in SPARE_STYLES} & set(colours) and not {m for _, m in SPARE_STYLES} & set(markers)
    assert algo_style("my_variant") in SPARE_STYLES and algo_style("my_variant") == algo_style("my_variant")
    assert len(set(SPARE_STYLES)) == 12  # three presets of one's own drew one style (ppo_huber, ppo_lr, variant_a)
    assert len({algo_style(name) for name in ("ppo_huber", "ppo_lr", "variant_a")}) == 3


def test_an_algorithm_keeps_its_colour_whatever_else_a_report_holds(monkeypatch, tmp_path):
    """Issue 16: the same preset is drawn in the same colour in two reports with different algorithm sets."""
    import matplotlib

    matplotlib.use("Agg")
    import benchmarks.report as report

    drawn = []
    monkeypatch.setattr(report, "save_figure", lambda fig, stem, **_: drawn.append(fig) or [stem])

    def runs_of(algos):
        return [{**fake_run("Acrobot", algo, seed, [0, 1000], [-500.0 + seed, -100.0 - seed]),
                 "config": {"env": {"id": "Acrobot-v1"}, "total_steps": 1000}} for algo in algos for seed in (0, 1)]

    colours = []
    for algos in (["ppo", "outer_ppo_lr", "hp3o"], ["hp3o", "my_variant"]):
        drawn.clear()
        report.plot_suite(runs_of(algos), "suite", tmp_path)
        lines = drawn[0].axes[0].get_lines()
        colours.append({line.get_label().split(" ")[0]: matplotlib.colors.to_hex(line.get_color()) for line in lines})
    assert colours[0]["hp3o"] == colours[1]["hp3o"] == report.algo_color("hp3o").lower()
    assert colours[0]["ppo"] != colours[1]["my_variant"]


def test_a_saturated_task_is_flagged_in_its_figures_and_panels_against_ppo_need_five_seeds(monkeypatch, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import benchmarks.report as report

    def runs_of(algos, seeds, final):
        return [{**fake_run("CartPole", algo, seed, [0, 1000], [20.0, final(algo, seed)]),
                 "config": {"env": {"id": "CartPole-v1"}, "total_steps": 1000}}
                for algo in algos for seed in range(seeds)]

    drawn = []
    monkeypatch.setattr(report, "save_figure", lambda fig, stem, **_: drawn.append(fig) or [stem])
    capped = runs_of(["ppo", "hp3o"], 5, lambda algo, seed: 500.0 if seed < 3 else 300.0 + (algo == "ppo"))
    assert report.task_saturated(capped) and not report.task_saturated(capped[:4])  # 4 runs: no ceiling to judge
    report.plot_suite(capped, "s", tmp_path)
    report.plot_versus_ppo(capped, "s", tmp_path, min_seeds=5)
    suite_title, versus_title = drawn[0].axes[0].get_title(), drawn[1]._suptitle.get_text()
    for title in (suite_title, versus_title):
        assert "CartPole saturates" in title.replace("\n", " ") and "bootstrap band" in title
    assert drawn[1].axes[0].get_legend() is None and drawn[1].axes[0].get_title() == "hp3o (n=5)"
    # one seed each: no band, no "95% bootstrap band" in the title, and no panels against PPO (a stale one goes)
    drawn.clear()
    single = runs_of(["ppo", "hp3o"], 1, lambda algo, seed: 100.0 + (algo == "ppo"))
    (tmp_path / "s_CartPole_vs_ppo.png").write_bytes(b"stale")
    assert report.plot_versus_ppo(single, "s", tmp_path, min_seeds=5) == []
    assert not (tmp_path / "s_CartPole_vs_ppo.png").exists()
    report.plot_suite(single, "s", tmp_path)
    assert "one seed per curve, no band" in drawn[0].axes[0].get_title() and not drawn[0].axes[0].collections
    assert report.band_note([3, 3]) == "mean over seeds, 95% bootstrap band, unreliable with fewer than 5 seeds"


def test_two_presets_with_the_same_curves_are_drawn_and_said_to_coincide(monkeypatch, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import benchmarks.report as report

    runs = [{**fake_run("Acrobot", algo, seed, [0, 1000], [-500.0, -100.0 - seed - 10 * (algo == "ppo")]),
             "config": {"env": {"id": "Acrobot-v1"}, "total_steps": 1000}}
            for algo in ("ppo", "hp3o", "hp3o_plus") for seed in range(2)]
    assert report.identical_to(runs) == {"hp3o_plus": "hp3o"}
    drawn = []
    monkeypatch.setattr(report, "save_figure", lambda fig, stem, **_: drawn.append(fig) or [stem])
    report.plot_suite(runs, "s", tmp_path)
    labels = [t.get_text() for t in drawn[0].axes[0].get_legend().get_texts()]
    assert "hp3o_plus (n=2, the same curve as hp3o)" in labels
    rows = pd.DataFrame({"algo": ["hp3o", "hp3o_plus", "ppo"], "seeds": [5, 5, 5], "final_mean": [0.834, 0.834, 0.677],
                         "saturated": [False] * 3, "same_eval_as": ["hp3o_plus", "hp3o", None]}).set_index("algo")
    caption = report.task_caption("T", rows, "fraction right", versus_missing=False)
    assert caption == ("T (fraction right), n = 5 seeds each: highest final mean, tied at 0.834: hp3o, hp3o_plus; "
                       "PPO 0.677. hp3o and hp3o_plus coincide: the same evaluations in every seed.")


def test_table_scores_keep_three_significant_digits_of_their_tasks_largest():
    """A task scored in [0, 1] read 0.7 [0.7, 0.7] for both 0.677 and 0.721 (one decimal everywhere); MuJoCo's and
    classic control's scores keep their one decimal."""
    from benchmarks.report import headline, task_decimals

    table = pd.DataFrame({"task": ["Arithmetic", "Arithmetic", "Praise", "HalfCheetah", "Pendulum", "Flat"],
                          "final_mean": [0.677, 0.721, 2.08, 2022.4, -150.3, 0.0],
                          "final_ci_low": [0.668, 0.713, 2.05, 1500.0, -170.0, 0.0],
                          "final_ci_high": [0.685, 0.730, 2.11, 2600.0, -130.0, 0.0]})
    assert task_decimals(table) == [3, 3, 2, 1, 1, 1]
    pivot = headline([ROOT / "results" / "tables" / "rlhf.csv", ROOT / "results" / "tables" / "mujoco_1m.csv"])
    assert "| 0.677 +- 0.010 " in pivot and "| 2438.9 +- 1194.7 " in pivot  # ppo on RLHFArithmetic, HalfCheetah


def test_a_populations_time_per_step_is_its_share_of_the_loop_it_shared(tmp_path):
    """Each seed of a population logs the whole loop's rollout and update times: us/step divides them among the
    seeds trained together (it gave 10 seeds' loop time per step of one, 10x a seed's cost), as cpu_hours does."""
    from benchmarks.report import wall_time_per_step
    from benchmarks.runs import trained_together

    pd.DataFrame({"env_steps": [1000, 2000], "rollout_time": [0.3, 0.3], "update_time": [0.1, 0.1]}).to_csv(
        tmp_path / "train.csv", index=False)
    alone = wall_time_per_step({"dir": tmp_path, "trained_together": 1})
    assert alone == pytest.approx(0.8 / 2000)
    assert wall_time_per_step({"dir": tmp_path, "trained_together": 4}) == pytest.approx(alone / 4)
    assert len(trained_together({"seed": 3, "batched": {"seeds": [0, 3], "trained_together": [3]}})) == 1
    assert len(trained_together({"seed": 3, "batched": {"seeds": [0, 1, 2, 3]}})) == 4
    assert trained_together({"seed": 3}) == [3]


def test_captions_quote_scores_with_enough_digits_and_say_what_a_single_preset_or_seed_gives():
    from benchmarks.report import score_texts, task_caption

    assert score_texts([0.834, 0.677]) == ["0.834", "0.677"]
    assert score_texts([2.147, 2.085]) == ["2.15", "2.08"]
    assert score_texts([2.147, 2.145]) == ["2.147", "2.145"]  # different values never read alike
    assert score_texts([2022.0, -82.5, 500.0]) == ["2022.0", "-82.5", "500.0"]
    one = pd.DataFrame({"algo": ["ppo"], "seeds": [1], "final_mean": [1889.9]}).set_index("algo")
    assert task_caption("HalfCheetah", one, "", versus_missing=False) == "HalfCheetah, n = 1 seed: final mean 1889.9."
    two = pd.DataFrame({"algo": ["outer_ppo", "ppo"], "seeds": [1, 1], "final_mean": [-1.6, 1889.9]}).set_index("algo")
    caption = task_caption("HalfCheetah", two, "", versus_missing=True)
    assert caption.startswith("HalfCheetah, n = 1 seed each: highest final mean ppo 1889.9. No panels against PPO")


def test_a_token_task_whose_reward_is_its_judge_gets_one_frontier_panel_in_its_own_metric(monkeypatch, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import benchmarks.report as report

    def runs_of(task, reward, coefs=(0.05,)):
        runs = []
        for coef in coefs:
            for seed in range(2):
                run_dir = tmp_path / task / f"{coef}" / f"seed{seed}"
                run_dir.mkdir(parents=True)
                score = [0.3, 0.5, 0.7 + coef]
                pd.DataFrame({"iteration": [0, 1, 2], "kl_to_reference": [0.0, 0.1, 0.2], "episode_return_mean": score,
                              "episode_judge": score if reward == "judge" else [0.3, 0.2, 0.1]}).to_csv(
                    run_dir / "train.csv", index=False)
                env = {"id": f"benchmarks.rlhf.env:RLHF/{task}-v0", "name": f"RLHF{task}", "family": "rlhf",
                       "kwargs": {"reward": reward}, "kl_penalty": {"coef": coef}}
                runs.append({"env": f"RLHF{task}", "algo": "ppo", "seed": seed, "dir": run_dir,
                             "config": {"env": env, "total_steps": 2048}})
        return runs

    drawn = []
    monkeypatch.setattr(report, "save_figure", lambda fig, stem, **_: drawn.append(fig) or [stem])
    arithmetic, praise = runs_of("Arithmetic", "judge"), runs_of("Praise", "model", coefs=(0.0, 0.05))
    report.plot_kl_frontier(arithmetic + praise, "rlhf", tmp_path)
    one, two = drawn
    assert len(one.axes) == 1 and one.axes[0].get_ylabel() == "fraction right"
    assert len(two.axes) == 2 and two.axes[0].get_ylabel() == "reward model's score (normalised)"
    assert {t.get_text() for t in two.axes[1].get_legend().get_texts()} == {"ppo, KL coef 0 (n=2)",
                                                                            "ppo, KL coef 0.05 (n=2)"}
    assert "no reward hacking can show" in report.frontier_caption("RLHFArithmetic", arithmetic)
    caption = report.frontier_caption("RLHFPraise", praise)
    assert caption.startswith("RLHFPraise, ppo at KL coefficients 0 (dashed) and 0.05, n = 2 seeds each: ")
    assert "rising while the judge's falls" in caption


def test_a_suite_named_after_its_tuning_budget_says_so_where_its_runs_go_further(tmp_path):
    from benchmarks.report import tuning_note

    def run(algo, tuning, total_steps):
        run_dir = tmp_path / algo / f"{tuning}_{total_steps}"
        (run_dir / ".hydra").mkdir(parents=True)
        tuned = f"- +tuning={tuning}\n" if tuning else ""
        (run_dir / ".hydra" / "overrides.yaml").write_text(f"- algo={algo}\n{tuned}")
        return {"algo": algo, "dir": run_dir, "config": {"total_steps": total_steps}}

    assert tuning_note([run("ppo", "mujoco_300k", 1000000), run("outer_ppo", "mujoco_300k", 1000000)]) == \
        "hyperparameters +tuning=mujoco_300k, tuned on 300k-step trials"
    assert tuning_note([run("ppo", "mujoco_100k", 1000000), run("outer_ppo", None, 1000000)]) == \
        "hyperparameters (ppo) +tuning=mujoco_100k, tuned on 100k-step trials"
    assert tuning_note([run("ppo", "mujoco_300k", 300000)]) == ""  # run at the budget it was tuned at


def test_a_sensitivity_cell_at_the_ceiling_is_marked():
    from benchmarks.report import sensitivity_cells

    runs = [fake_run("CartPole", "outer_ppo_nesterov", seed, [0, 1000], [20.0, final])
            for seed, final in enumerate([500.0, 500.0, 200.0, 495.0])]
    cells = sensitivity_cells(runs, "CartPole", {(0.5, 0.0): [500.0, 495.0], (1.0, 0.0): [500.0, 200.0]})
    assert cells == {(0.5, 0.0): (497.5, 2, True), (1.0, 0.0): (350.0, 2, False)}


# The committed results: what they say is what the committed runs and report code make (no training).

def test_results_figures_md_is_the_page_the_report_writes_from_the_committed_tables():
    from benchmarks.report import RESULTS, committed_suites, figures_page

    assert (RESULTS / "figures.md").read_text() == figures_page(RESULTS, committed_suites())


def test_every_committed_suite_was_reported_from_its_committed_runs_with_the_committed_report_code():
    """results/report_stamps.json holds each suite's digest of its runs and the report's code as they were when its
    tables and figures were written: a run or a line of the report changed since, and this fails until
    `python -m benchmarks.report` is rerun and its output committed."""
    import json

    from benchmarks.report import STAMPS, committed_suites, suite_stamp

    stamps = json.loads(STAMPS.read_text())
    assert {suite.name: suite_stamp(suite) for suite in committed_suites()} == stamps


def test_a_suite_stamp_ignores_what_git_does_not_keep(tmp_path):
    """Checkpoints, TensorBoard events and locks exist where the runs were trained and not in a clone: the stamp
    must be the same in both places, and change when a committed file does."""
    from benchmarks.report import suite_stamp

    run = tmp_path / "suite" / "CartPole" / "ppo" / "seed0"
    run.mkdir(parents=True)
    (run / "train.csv").write_text("step,return\n0,1\n")
    clone = suite_stamp(tmp_path / "suite")
    (run / "checkpoint.pt").write_bytes(b"weights")
    (run / ".lock").write_text("")
    (run / "events.out.tfevents.1.host").write_bytes(b"tb")
    assert suite_stamp(tmp_path / "suite") == clone
    (run / "train.csv").write_text("step,return\n0,2\n")
    assert suite_stamp(tmp_path / "suite") != clone


@pytest.mark.slow
def test_every_committed_table_and_figures_md_regenerate_byte_for_byte_from_the_committed_runs(tmp_path):
    from benchmarks.report import RESULTS, committed_suites, figures_page, report_suites

    suites = committed_suites()
    report_suites(suites, tmp_path, jobs=2, plots=False)
    written = sorted(path.name for path in (tmp_path / "tables").iterdir())
    assert written  # every suite's tables, as committed, and nothing else of theirs is left in results/tables
    for name in written:
        assert (tmp_path / "tables" / name).read_bytes() == (RESULTS / "tables" / name).read_bytes(), name
    assert figures_page(tmp_path, suites, drawn=RESULTS) == (RESULTS / "figures.md").read_text()


def test_the_mujoco_aggregate_and_the_claims_table_compare_the_same_tasks_and_agree():
    """Each MuJoCo claim row against the aggregate of the suite it was measured on: the same tasks, seeds and
    probability of improvement (the aggregate's normalisation leaves it as it is)."""
    from benchmarks.report import RESULTS

    claims = pd.read_csv(RESULTS / "tables" / "claims.csv")
    mujoco = claims[(claims["group"] == "mujoco") & (claims["metric"] == "final")]
    assert len(mujoco) >= 4
    for _, claim in mujoco.iterrows():
        aggregate = pd.read_csv(RESULTS / "tables" / f"{claim['suite']}_aggregate.csv").set_index("algo")
        row = aggregate.loc[claim["preset"]]
        assert sorted(claim["tasks"].replace("*", "").split(", ")) == row["task_names"].split()
        assert claim["seeds"] == row["seeds_per_task"]
        assert (row["poi_vs_ppo"], row["poi_ci_low"], row["poi_ci_high"]) == (
            claim["value"], claim["ci_low"], claim["ci_high"])


@pytest.mark.parametrize("module", ["benchmarks.report", "benchmarks.claims"])
def test_a_folder_of_suites_is_refused_in_one_line_instead_of_pooled_into_one_suite(module, tmp_path, capsys):
    import importlib

    for suite in ("one", "two"):
        (tmp_path / "runs" / suite / "CartPole" / "ppo").mkdir(parents=True)
    with pytest.raises(SystemExit) as exit_:
        importlib.import_module(module).main([str(tmp_path / "runs"), "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2 and not (tmp_path / "out").exists()
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"python -m {module}: error: argument suites: {tmp_path / 'runs'} is a folder of suites (one, two), "
        f"not one suite: name the suites, e.g. {tmp_path / 'runs' / 'one'}")


def test_headline_of_a_missing_or_foreign_table_is_one_line(tmp_path, capsys):
    from benchmarks.report import main

    with pytest.raises(SystemExit) as stop:
        main(["--headline", str(tmp_path / "nosuch.csv")])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"python -m benchmarks.report: error: argument --headline: {tmp_path / 'nosuch.csv'} does not exist")
    (tmp_path / "other.csv").write_text("algo,value\nppo,1\n")
    with pytest.raises(SystemExit) as stop:
        main(["--headline", str(tmp_path / "other.csv")])
    assert str(stop.value) == (f"error: --headline reads suite result tables (results/tables/<suite>.csv); "
                               f"{tmp_path / 'other.csv'} has no column task, env_steps, final_mean, final_std")
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(SystemExit) as stop:
        main(["--headline", str(tmp_path / "empty.csv")])
    assert str(stop.value).startswith(f"error: --headline: {tmp_path / 'empty.csv'} is not a CSV table (")
    table = ROOT / "results" / "tables" / "mujoco_1m.csv"
    with pytest.raises(SystemExit) as stop:
        main(["--headline", str(table), str(table)])
    assert str(stop.value) == ("error: --headline: the tables give hp3o on Ant (999k) more than once: name tables "
                               "of different tasks or budgets")


def test_a_budget_is_written_short_when_round_and_exactly_when_not():
    from benchmarks.report import steps_text

    assert [steps_text(steps) for steps in (0, 2500, 300_000, 1_000_000, 1_500_000)] == [
        "0", "2.5k", "300k", "1M", "1.5M"]
    assert [steps_text(steps) for steps in (2048, 20_480, 1_048_576, 1_050_000, 100_000_100)] == [
        "2,048", "20,480", "1,048,576", "1,050,000", "100,000,100"]
