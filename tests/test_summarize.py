"""benchmarks.summarize: the terminal quick look at stored runs."""

import pandas as pd
import pytest

from benchmarks.engine.logger import read_csv_complete_rows
from benchmarks.summarize import train_column_means


def test_train_column_means_over_all_or_the_last_iterations_of_each_seed(tmp_path):
    runs = []
    for seed, values in ((0, [0.0, 1.0, 2.0, 3.0]), (1, [10.0, 11.0, 12.0, 13.0])):
        run_dir = tmp_path / f"seed{seed}"
        run_dir.mkdir()
        pd.DataFrame({"iteration": [1, 2, 3, 4], "kl_to_reference": values}).to_csv(run_dir / "train.csv", index=False)
        runs.append({"env": "RLHFPraise", "algo": "ppo", "dir": run_dir})
    every = train_column_means(runs, ["kl_to_reference", "absent"])
    assert every["kl_to_reference"].iloc[0] == 6.5 and every["absent"].iloc[0] is None
    last_two = train_column_means(runs, ["kl_to_reference"], last=2)
    assert last_two["kl_to_reference"].iloc[0] == (2 + 3 + 12 + 13) / 4
    first_one = train_column_means(runs, ["kl_to_reference"], first=1)
    assert first_one["kl_to_reference"].iloc[0] == (0 + 10) / 2


def test_final_eval_columns_are_the_last_evaluations_mean_and_std_over_seeds():
    import numpy as np

    from benchmarks.runs import load_runs
    from benchmarks.summarize import final_eval_columns
    from tests.conftest import ROOT

    suite = ROOT / "results/runs/rlhf/RLHFArithmetic/ppo"
    row = final_eval_columns(load_runs(suite), ["eval_judge_mean", "no_such_column"]).iloc[0]
    finals = np.array([read_csv_complete_rows(suite / f"seed{seed}" / "eval.csv")["eval_judge_mean"].iloc[-1] for seed in range(5)])
    assert row["eval_judge_mean"] == f"{finals.mean():.2f} +- {finals.std():.2f}" and row["no_such_column"] is None


def write_run(path, seed, status="complete", env="Hopper", **summary):
    """A stored run of one evaluation, one episode and one iteration, its summary.json given `summary` beside
    the keys every reader needs (a given config's env and algo blocks added to theirs; one that is no mapping
    replaces it)."""
    import json

    config = {"env": {"name": env, "id": f"{env}-v5", "family": "mujoco"},
              "algo": {"name": summary.get("algo", "ppo"), "algorithm": "ppo"}}
    given = summary.pop("config", {})
    if isinstance(given, dict):
        config.update({key: {**config[key], **value} if key in config else value for key, value in given.items()})
    else:
        config = given
    path.mkdir(parents=True)
    (path / "summary.json").write_text(json.dumps({
        "status": status, "env": env, "algo": "ppo", "seed": seed, "env_steps": 2048, "sps": 100.0, "config": config,
        **summary}))
    pd.DataFrame({"env_steps": [2048], "eval_return_mean": [1.0], "eval_return_std": [0.0]}).to_csv(
        path / "eval.csv", index=False)
    pd.DataFrame({"env_steps": [2048], "episode_return": [5.0], "episode_length": [10]}).to_csv(
        path / "episodes.csv", index=False)
    pd.DataFrame({"env_steps": [2048], "iteration": [1], "rollout_time": [1.0], "update_time": [1.0]}).to_csv(
        path / "train.csv", index=False)


def test_cpu_hours_share_a_populations_training_time_among_its_seeds(tmp_path, capsys):
    """A population's loop time is its process's: each of its seeds costs its share; a single run costs its own."""
    from benchmarks.summarize import main

    def run(path, seed, wall_time_s, together):
        write_run(path, seed, algo=path.parent.name, wall_time_s=wall_time_s,
                  **({"batched": {"seeds": together}} if together else {}))

    for seed in range(4):  # one process: 3600 s of loop time for four seeds
        run(tmp_path / "suite" / "Hopper" / "ppo" / f"seed{seed}", seed, 3600.0, [0, 1, 2, 3])
    run(tmp_path / "suite" / "Hopper" / "hp3o" / "seed0", 0, 1800.0, None)
    main([str(tmp_path / "suite")])
    out = capsys.readouterr().out
    assert "CPU-hours in all: 1.50 (5 runs" in out


def test_seeds_that_finished_no_training_episode_are_counted_in_the_last_episodes_column(tmp_path):
    from benchmarks.runs import load_runs
    from benchmarks.summarize import summarize

    for algo in ("ppo", "hp3o"):
        for seed in range(3):
            write_run(tmp_path / "suite" / "Hopper" / algo / f"seed{seed}", seed, algo=algo, wall_time_s=10.0)
    for algo, seeds in (("ppo", (0, 2)), ("hp3o", (0, 1, 2))):  # budgets that ended before any episode did
        for seed in seeds:
            (tmp_path / "suite" / "Hopper" / algo / f"seed{seed}" / "episodes.csv").write_text(
                "env_steps,episode_return,episode_length\n")
    table = summarize(load_runs(tmp_path / "suite")).set_index("algo")
    assert table.loc["ppo", "last100_train"] == "5.00 +- 0.00 (2 of 3 seeds ended no episode)"
    assert table.loc["hp3o", "last100_train"] == "no episode ended (3 of 3 seeds)"


def test_summarize_names_the_runs_it_leaves_out_a_population_in_one_line(tmp_path, capsys):
    """Runs the table leaves out are said, one line per directory and reason: an interrupted population's seeds
    together, a run whose trainer is alive as training now (its lock file's pid), a stale lock file ignored."""
    import os
    import subprocess
    import sys

    from benchmarks.summarize import main

    def run(path, seed, status, **extra):
        write_run(path, seed, status, env="Ant", wall_time_s=10.0, **extra)

    suite = tmp_path / "suite"
    run(suite / "Hopper" / "ppo" / "seed0", 0, "complete")
    for seed in (0, 1, 2, 10):  # seed10 sorts after seed2; not consecutive: listed
        run(suite / "Ant" / "ppo" / f"seed{seed}", seed, "interrupted", signal="SIGTERM")
    for seed in range(3):
        run(suite / "Swimmer" / "ppo" / f"seed{seed}", seed, "interrupted", signal="SIGTERM")
    run(suite / "Ant" / "hp3o" / "seed0", 0, "interrupted", signal="SIGTERM")
    (suite / "Ant" / "hp3o" / "seed0" / ".lock").write_text(str(os.getpid()))  # a live trainer
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    run(suite / "Walker2d" / "ppo" / "seed0", 0, "interrupted", signal="SIGTERM")
    (suite / "Walker2d" / "ppo" / "seed0" / ".lock").write_text(dead.stdout.strip())  # its trainer was killed

    run(suite / "Hopper" / "ppo" / "seed1", 1, "complete")
    (suite / "Hopper" / "ppo" / "seed1" / ".lock").write_text(str(os.getpid()))  # a killed trainer's, pid reused
    main([str(suite)])
    out = capsys.readouterr().out
    assert "(2 runs;" in out  # the complete run with a stale lock file is in the table
    assert "left out: Ant/ppo/seed0, seed1, seed2, seed10: interrupted by SIGTERM at 2048 env steps (resumable)" in out
    assert "left out: Swimmer/ppo/seed0-2 (3 runs): interrupted by SIGTERM at 2048 env steps (resumable)" in out
    assert f"left out: Ant/hp3o/seed0: training now (pid {os.getpid()})" in out
    assert "left out: Walker2d/ppo/seed0: interrupted by SIGTERM at 2048 env steps (resumable)" in out


def test_a_column_no_run_logs_and_a_folder_of_suites_are_one_line_each(tmp_path, capsys):
    """A train.csv or eval.csv column that no run logs is a typo (a preset without it shows None instead), said with
    the nearest column and every column the runs log; a folder whose folders are two or more suites is not one
    suite: both are refused in one line, before anything is printed."""
    import pytest

    from benchmarks.summarize import main

    write_run(tmp_path / "results" / "suite" / "Hopper" / "ppo" / "seed0", 0)
    write_run(tmp_path / "results" / "other" / "Hopper" / "ppo" / "seed0", 0)
    for arguments, message in (
            ([str(tmp_path / "results" / "suite"), "--train-columns", "rollout_time", "rolout_time"],
             f"--train-columns: no run under {tmp_path / 'results' / 'suite'} logs rolout_time (did you mean "
             f"rollout_time?); its runs log env_steps, iteration, rollout_time, update_time"),
            ([str(tmp_path / "results" / "suite"), "--eval-columns", "eval_return_men", "gibberish"],
             f"--eval-columns: no run under {tmp_path / 'results' / 'suite'} logs eval_return_men (did you mean "
             f"eval_return_mean?), gibberish; its runs log env_steps, eval_return_mean, eval_return_std"),
            ([str(tmp_path / "results" / "suite"), "--train-columns", "entropy", "--last-iterations", "0"],
             "argument --last-iterations: must be an integer in [1, inf), got 0"),
            ([str(tmp_path / "results")],
             f"argument runs_dir: {tmp_path / 'results'} is a folder of suites (other, suite), not one suite: name "
             f"the suites, e.g. {tmp_path / 'results' / 'other'}")):
        with pytest.raises(SystemExit) as stop:
            main(arguments)
        captured = capsys.readouterr()
        assert stop.value.code == 2 and captured.out == ""
        assert captured.err.strip().splitlines()[-1] == f"python -m benchmarks.summarize: error: {message}"


@pytest.mark.parametrize("command", [["benchmarks.summarize", "results/reference/ci"],
                                     ["benchmarks.regression", "--reference", "results/reference/ci", "--candidate",
                                      "results/reference/ci"]])
def test_a_table_command_whose_reader_stops_early_ends_quietly(command):
    """`python -m benchmarks.summarize ... | head`: its output's reader gone, the command stops with 141 (128 +
    SIGPIPE, as a Unix tool) and nothing on stderr (it printed a BrokenPipeError traceback)."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has stopped before the first line
    try:
        result = subprocess.run([sys.executable, "-m", *command], cwd=ROOT, stdout=write_end, stderr=subprocess.PIPE,
                                text=True, timeout=300)
    finally:
        os.close(write_end)
    assert (result.returncode, result.stderr) == (141, "")


def test_runs_of_several_configurations_of_a_preset_are_said_instead_of_averaged_as_seeds(tmp_path, capsys):
    """The points of a sweep over algo.lr in one folder (each in its own subdir) are runs of ppo on Hopper:
    summarize gives each point its own row; report, the regression check and claims name two of them and the key
    they differ in, and write no table (they averaged the points as seeds: 'seeds 0 0'); a seed held twice in one
    configuration is refused by all."""
    from benchmarks.claims import main as claims_main
    from benchmarks.regression import main as regression_main
    from benchmarks.report import main as report_main
    from benchmarks.summarize import main

    def write(path, seed, lr):
        write_run(path, seed, config={"algo": {"algorithm": "ppo", "lr": lr}, "env": {}, "seed": seed})

    suite = tmp_path / "lr_sweep"
    for lr in (0.001, 0.0003):
        write(suite / "Hopper" / "ppo" / f"algo.lr={lr}" / "seed0", 0, lr)
    main([str(suite)])
    rows = [line.split()[:4] for line in capsys.readouterr().out.splitlines()[1:3]]
    assert rows == [["Hopper", "ppo", "(algo.lr=0.0003)", "0"], ["Hopper", "ppo", "(algo.lr=0.001)", "0"]]
    line = (f"Hopper/ppo holds runs of more than one configuration ({suite / 'Hopper/ppo/algo.lr=0.0003/seed0'} and "
            f"{suite / 'Hopper/ppo/algo.lr=0.001/seed0'} differ in: algo.lr): a table takes the seeds of one; name "
            f"each configuration's directory on its own")
    stale = [suite / "report" / "tables" / "lr_sweep.md", suite / "report" / "plots" / "lr_sweep_aggregate.png",
             suite / "report" / "plots" / "lr_sweep_Hopper.svg"]  # as an earlier report wrote them
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("seeds 2")
    with pytest.raises(SystemExit) as refused:
        report_main([str(suite)])
    assert str(refused.value) == "error: not reported: lr_sweep (above: why)"
    assert f"lr_sweep: not reported: {line}" in capsys.readouterr().out
    assert not any(path.exists() for path in stale)
    assert regression_main(["--reference", str(suite / "Hopper" / "ppo" / "algo.lr=0.001"),
                            "--candidate", str(suite)]) == 2
    assert capsys.readouterr().err == f"error: --candidate {suite}: {line}\n"
    assert regression_main(["--reference", str(suite), "--candidate", str(suite / "Hopper" / "ppo" / "algo.lr=0.001")]) == 2
    assert capsys.readouterr().err == f"error: --reference {suite}: {line}\n"
    with pytest.raises(SystemExit):
        claims_main([str(suite), "--out", str(tmp_path / "claims")])
    assert capsys.readouterr().err.endswith(f"error: {suite}: {line}\n")
    main([str(suite / "Hopper" / "ppo" / "algo.lr=0.001")])  # one point: its own table
    assert "Hopper  ppo     0" in capsys.readouterr().out

    # other seeds of each point (seed 1 at lr 0.0003 beside seed 0 at 0.001), and one run copied beside itself
    other_seeds, copies = tmp_path / "other_seeds", tmp_path / "copies"
    write(other_seeds / "Hopper" / "ppo" / "a" / "seed0", 0, 0.001)
    write(other_seeds / "Hopper" / "ppo" / "b" / "seed1", 1, 0.0003)
    write(copies / "Hopper" / "ppo" / "seed0", 0, 0.001)
    write(copies / "Hopper" / "ppo" / "copy" / "seed0", 0, 0.001)
    main([str(other_seeds)])
    rows = [line.split()[:4] for line in capsys.readouterr().out.splitlines()[1:3]]
    assert rows == [["Hopper", "ppo", "(algo.lr=0.0003)", "1"], ["Hopper", "ppo", "(algo.lr=0.001)", "0"]]
    with pytest.raises(SystemExit) as refused:
        main([str(copies)])
    assert str(refused.value) == (f"error: Hopper/ppo holds seed 0 more than once ({copies / 'Hopper/ppo/copy/seed0'} "
                                  f"and {copies / 'Hopper/ppo/seed0'}, the same configuration): a table takes one run "
                                  f"per seed; keep one")
    # how the numbers were computed is no other configuration: the engine's backend, threads, device
    how = tmp_path / "how"
    write_run(how / "Hopper" / "ppo" / "seed0", 0, config={"algo": {"algorithm": "ppo", "backend": "compiled"},
                                                           "env": {}, "torch_threads": 1, "device": "cpu"})
    write_run(how / "Hopper" / "ppo" / "seed1", 1, config={"algo": {"algorithm": "ppo", "backend": "torch"},
                                                           "env": {}, "torch_threads": 2, "device": "cuda"})
    main([str(how)])
    assert "Hopper  ppo   0 1" in capsys.readouterr().out
    # a config that is no run config as the trainer writes it is a corrupt summary: left out, saying why
    odd = tmp_path / "odd"
    write_run(odd / "Hopper" / "ppo" / "seed0", 0)
    write_run(odd / "Hopper" / "ppo" / "seed1", 1, config=[1])
    main([str(odd)])
    out = capsys.readouterr().out
    assert "Hopper  ppo     0" in out and ("left out: Hopper/ppo/seed1: corrupt summary.json (its config has no "
                                           "env.name, env.id, env.family, algo.name, algo.algorithm)") in out
