"""benchmarks.reproduce: a stored run retrained from its own config gives every logged number again."""

import pytest
from conftest import QUIET, SMALL_UPDATE

from benchmarks.reproduce import main as reproduce_main
from benchmarks.engine.trainer import train
from tests.commands import run_python


@pytest.mark.slow
def test_reproduce_confirms_a_run_and_flags_another_backend(make_config, tmp_path, capsys):
    run_dir = tmp_path / "run"
    summary = train(make_config(["env=CartPole", "algo=ppo", "algo.backend=torch", "seed=3", "total_steps=2048",
                                 *SMALL_UPDATE, *QUIET]), run_dir)
    assert "task_models" not in summary  # only a task computed with trained models (a token task's) records them

    with pytest.raises(SystemExit) as same:
        reproduce_main([str(run_dir)])
    out = capsys.readouterr().out
    assert same.value.code == 0
    assert "same train.csv: 4 rows, every number identical" in out and "1 of 1 runs reproduce" in out
    assert "note:" not in out  # same machine: nothing to say

    with pytest.raises(SystemExit) as other:
        reproduce_main([str(run_dir), "--set", "algo.backend=compiled"])  # other float rounding
    out = capsys.readouterr().out
    assert other.value.code == 1
    assert "DIFF train.csv" in out and "0 of 1 runs reproduce" in out


def test_a_run_of_the_retired_numpy_backend_is_named_in_one_line_and_kept_as_data(make_config, tmp_path, capsys):
    import json
    import sys

    from conftest import ROOT

    run_dir = tmp_path / "run"
    train(make_config(["env=CartPole", "algo.backend=torch", "total_steps=512", *QUIET]), run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["config"]["algo"]["backend"] = "numpy"  # as the runs made on it store it
    (run_dir / "summary.json").write_text(json.dumps(summary))
    capsys.readouterr()  # the training's own lines
    with pytest.raises(SystemExit) as retired:
        reproduce_main([str(run_dir)])
    lines = capsys.readouterr().out.splitlines()
    assert retired.value.code == 0
    assert lines == [f"{run_dir}: made with the retired algo.backend=numpy (a hand-derived gradient of PPO's loss; "
                     f"autograd computes it now): its numbers stay as data and are not rerun "
                     f"(--set algo.backend=compiled retrains it on the compiled engine)",
                     "0 of 0 runs reproduce every logged number (1 made with a retired backend: data, not rerun)"]
    # an override naming the retired backend is refused in one line
    with pytest.raises(SystemExit) as refused:
        reproduce_main([str(run_dir), "--set", "algo.backend=numpy"])
    assert refused.value.code == 2 and capsys.readouterr().err.endswith(
        "argument --set: algo.backend=numpy is a retired backend (a hand-derived gradient of PPO's loss; autograd "
        "computes it now); use algo.backend=compiled or torch\n")
    # and the command that made it (now on the compiled engine by default) counts it complete
    again = run_python([sys.executable, str(ROOT / "run.py"), "env=CartPole", "total_steps=512", *QUIET,
                            f"hydra.run.dir={run_dir}"], cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 0 and f"already complete, skipped: {run_dir}" in again.stderr, again.stderr[-2000:]


def test_a_run_records_its_cpu_and_reproduce_says_when_it_compares_across_cpus(make_config, tmp_path):
    import json

    from benchmarks.reproduce import machine_note
    from benchmarks.engine.run_dir import machine

    run_dir = tmp_path / "run"
    train(make_config(["env=CartPole", "total_steps=512", *QUIET]), run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["machine"] == machine() and summary["machine"]["torch_cpu_capability"] in ("DEFAULT", "AVX2", "AVX512")
    assert machine_note(run_dir) is None
    summary["machine"] = {**summary["machine"], "cpu": "AMD EPYC 7B13", "torch_cpu_capability": "AVX2"}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    assert machine_note(run_dir) == (f"stored on AMD EPYC 7B13 (AVX2 kernels), rerun on {machine()['cpu']} "
                                     f"({machine()['torch_cpu_capability']} kernels): float results may differ "
                                     f"across instruction sets")
    del summary["machine"]
    (run_dir / "summary.json").write_text(json.dumps(summary))
    assert machine_note(run_dir).startswith("the run predates machine records")


def test_the_loop_times_its_phases_and_the_profile_reads_them(make_config, tmp_path):
    import json

    from benchmarks.engine.trainer import LOOP_PHASES
    from benchmarks.speed.profile import phase_shares

    run_dir = tmp_path / "run"
    train(make_config(["env=Pendulum", "total_steps=4096", "eval.every_steps=2048", *QUIET]), run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    seconds = summary["phase_seconds"]
    assert list(seconds) == list(LOOP_PHASES)
    assert all(seconds[phase] > 0 for phase in ("act", "env step", "update", "evaluation"))
    assert sum(seconds.values()) <= summary["wall_time_s"]  # the rest is the loop's own bookkeeping
    shares = phase_shares(summary)
    assert abs(sum(shares.values()) - 1.0) < 1e-9 and shares["rest of the loop"] >= 0


@pytest.mark.slow
def test_a_seed_of_a_batch_is_reproduced_by_rerunning_its_batch(make_config, tmp_path, capsys):
    from benchmarks.engine.batch_trainer import train_batch

    config = make_config(["env=Pendulum", "seeds=[4,5,6]", "total_steps=2048", "eval.every_steps=1024",
                          *SMALL_UPDATE, *QUIET])
    runs = [tmp_path / "job" / f"seed{seed}" for seed in (4, 5, 6)]
    train_batch(config, runs)

    with pytest.raises(SystemExit) as same:
        reproduce_main([str(runs[2]), str(runs[0])])  # the batch is retrained once, for both
    out = capsys.readouterr().out
    assert same.value.code == 0 and "2 of 2 runs reproduce every logged number" in out, out

    # An override that takes the seed out of its batch retrains it alone, and says so.
    with pytest.raises(SystemExit):
        reproduce_main([str(runs[0]), "--set", "seeds=null"])
    assert "retrain it alone" in capsys.readouterr().out
    # The torch backend trains populations too (eagerly, each seed's own code): the batch is retrained as one,
    # and its eager rounding differs from the compiled program's.
    with pytest.raises(SystemExit) as torch_backend:
        reproduce_main([str(runs[0]), "--set", "algo.backend=torch"])
    out = capsys.readouterr().out
    assert torch_backend.value.code == 1 and "retrain it alone" not in out and "DIFF train.csv" in out


def test_a_suite_directory_gives_its_runs_or_one_per_preset(make_config, tmp_path):
    from benchmarks.reproduce import runs_to_check

    for algo in ("ppo", "hp3o"):
        for seed in (0, 1):
            train(make_config(["env=CartPole", f"algo={algo}", f"seed={seed}", "total_steps=512", *QUIET]),
                  tmp_path / "suite" / "CartPole" / algo / f"seed{seed}")
    suite = tmp_path / "suite"
    assert len(runs_to_check([suite], one_per_preset=False)) == 4
    assert runs_to_check([suite], one_per_preset=True) == [suite / "CartPole" / "hp3o" / "seed1",
                                                           suite / "CartPole" / "ppo" / "seed1"]
    run = suite / "CartPole" / "ppo" / "seed0"
    assert runs_to_check([run, suite], one_per_preset=True)[0] == run  # a run directory is taken as it is


def test_a_statistic_logged_since_is_no_difference_but_a_lost_or_changed_one_is(tmp_path):
    import pandas as pd

    from benchmarks.reproduce import COMPARED_LOGS, compare_logs

    stored, rerun = tmp_path / "stored", tmp_path / "rerun"
    for directory, extra in ((stored, {}), (rerun, {"outer_sigma_eff": [1.0, 1.0]})):
        directory.mkdir()
        for name in COMPARED_LOGS:
            pd.DataFrame({"env_steps": [512, 1024], "loss": [0.5, 0.25], **extra}).to_csv(directory / name, index=False)
    lines = compare_logs(stored, rerun)
    assert all(line.startswith("same") and "added since" in line for line in lines), lines
    assert all(line.startswith("DIFF") for line in compare_logs(rerun, stored))  # a column the rerun lost
    pd.DataFrame({"env_steps": [512, 1024], "loss": [0.5, 0.26], "outer_sigma_eff": [1.0, 1.0]}).to_csv(
        rerun / COMPARED_LOGS[0], index=False)
    assert compare_logs(stored, rerun)[0].startswith("DIFF")


def test_a_population_run_is_rerun_compiled_or_eager_as_it_was_made(make_config, tmp_path, capsys, monkeypatch):
    """Compiled and eager programs round differently: the summary records which one trained, and the rerun uses it
    whatever this process would choose (here: a run made eager, as without a C++ compiler, rerun where compiling
    is the default)."""
    import json

    monkeypatch.setenv("POPULATION_COMPILE", "0")
    run_dir = tmp_path / "run"
    train(make_config(["env=CartPole", "total_steps=1024", *QUIET]), run_dir)
    assert json.loads((run_dir / "summary.json").read_text())["batched"]["program"] == "eager"
    monkeypatch.setenv("POPULATION_COMPILE", "1")
    capsys.readouterr()
    with pytest.raises(SystemExit) as same:
        reproduce_main([str(run_dir)])
    out = capsys.readouterr().out
    assert same.value.code == 0 and "1 of 1 runs reproduce every logged number" in out, out
    assert "note:" not in out  # a population of one is retrained as one, without a note


@pytest.mark.slow
def test_a_packed_run_is_compared_on_the_last_100_episodes_its_suite_keeps(make_config, tmp_path, capsys):
    from benchmarks.pack import main as pack_main

    run_dir = tmp_path / "suite" / "CartPole" / "ppo" / "seed0"
    # hardly learning: short episodes
    train(make_config(["env=CartPole", "algo=ppo", "algo.backend=torch", "total_steps=6144", "algo.lr=1e-5",
                       *SMALL_UPDATE, *QUIET]), run_dir)
    episodes = (run_dir / "episodes.csv").read_text().count("\n") - 1
    assert episodes > 100  # CartPole's first episodes last ~20 steps
    pack_main([str(tmp_path / "suite")])
    capsys.readouterr()

    with pytest.raises(SystemExit) as same:
        reproduce_main([str(run_dir)])
    out = capsys.readouterr().out
    assert same.value.code == 0, out
    assert (f"same episodes.csv: 100 rows (the last 100 of the rerun's {episodes}: all a packed suite keeps), every "
            f"number identical") in out
