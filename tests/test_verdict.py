"""`python -m benchmarks.verdict`: a preset's whole protocol (study, final evaluation beside PPO, comparison) in
one command, on a tiny budget; rerun, it trains nothing more."""

from __future__ import annotations

import os
import sys

import optuna
import pandas as pd
import pytest

from tests.commands import run_python



@pytest.mark.slow
def test_the_protocol_runs_end_to_end_and_resumes_without_retraining(tmp_path):
    command = [sys.executable, "-m", "benchmarks.verdict", "--algo", "ppo_kl", "--tune", "classic", "--suite",
               "classic_tuned",
               "--study-args", f"total_steps=1024 eval.every_steps=512 eval.episodes=1 hydra.sweeper.n_trials=2 "
                               f"hydra.sweeper.trials_per_batch=2 hydra.sweeper.tasks=[CartPole] "
                               f"hydra.sweeper.storage=sqlite:///{tmp_path}/study.db hydra.sweep.dir={tmp_path}/tuning",
               "--suite-args", f"env=CartPole seeds=[0,1,2] total_steps=1024 eval.every_steps=512 eval.episodes=1 "
                               f"hydra.sweep.dir={tmp_path}/suite",
               "--out", "verdict", "--", "logging.tensorboard=false"]
    # the protocol, not the compiler, is under test: the same loop runs its program eager
    environment = {**os.environ, "POPULATION_COMPILE": "0"}
    # given from another directory: --out is read from there, the steps still run in the project
    first = run_python(command, cwd=tmp_path, capture_output=True, text=True, timeout=900, env=environment)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    study = optuna.load_study(study_name="ppo_kl", storage=f"sqlite:///{tmp_path}/study.db")
    assert len(study.trials) == 2 and study.best_trial.params.keys() == {"algo.kl_target", "algo.kl_beta_init"}
    table = pd.read_csv(tmp_path / "verdict" / "verdict.csv")
    assert list(table["group"]) == ["discrete"] * 3 and (table["seeds"] == 3).all()
    assert table["tasks"].iloc[0] == "CartPole*"  # a tuning task, marked
    for seed in (0, 1, 2):  # the candidate ran with the study's best values, on the engine that computes its loss
        config = pd.read_json(tmp_path / "verdict" / "runs" / "CartPole" / "ppo_kl" / f"seed{seed}" / "summary.json",
                              typ="series")["config"]
        assert config["algo"]["kl_target"] == pytest.approx(study.best_trial.params["algo.kl_target"])
        assert config["algo"]["backend"] == "compiled"
    text = (tmp_path / "verdict" / "verdict.md").read_text()
    assert text.startswith("# Does ppo_kl beat PPO?") and "P(final eval return > PPO's)" in text
    assert (tmp_path / "verdict" / "ppo_kl_classic_tuned_CartPole_vs_ppo.png").stat().st_size > 10_000

    again = run_python(command, cwd=tmp_path, capture_output=True, text=True, timeout=900, env=environment)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "tuning ppo_kl: trial(s)" not in again.stdout + again.stderr  # the study asks no trial again
    assert (again.stdout + again.stderr).count("already complete, skipped") == 6


@pytest.mark.parametrize("arguments, message", [
    (["--algo", "ppo_kl", "--tune", "mujoco_1m", "--suite", "classic_10seeds"],
     "--tune mujoco_1m tunes on HalfCheetah, Hopper (mujoco) but --suite classic_10seeds evaluates CartPole, "
     "Pendulum, Acrobot, MountainCarContinuous (classic, classic_continuous): pick the tuning round of the suite's "
     "family, or --tune none (no study: the preset's own values)"),
    (["--algo", "ppo", "--tune", "classic_pruned", "--suite", "classic_10seeds"],
     "--algo ppo is the baseline: PPO's study and its final runs in the suite are what every verdict compares "
     "against; give a variant"),
    (["--algo", "ppo_kl", "--tune", "classic_pruned", "--suite", "classic_10seeds", "--out", "/dev/null/verdict"],
     "argument --out: /dev/null/verdict cannot be made: Not a directory"),  # said before the study's hours, not after
    (["--algo", "ppo_kl", "--tune", "classic_pruned", "--suite", "classic_10seeds", "--study-args",
      "~hydra.sweeper.search_spaces.ppo_kl"],  # as a preset of one's own that the round does not name
     "--tune classic_pruned has no search space for ppo_kl (it has hp3o, hp3o_plus, outer_ppo, outer_ppo_biased, "
     "outer_ppo_lr, outer_ppo_nesterov, ppo): add one to conf/tune/classic_pruned.yaml's "
     "hydra.sweeper.search_spaces, or give it in --study-args, e.g. --study-args "
     "\"'+hydra.sweeper.search_spaces.ppo_kl={algo.ent_coef:{low:0.0,high:0.02}}'\" ({}: nothing searched, its "
     "study trains the values so far once)"),
])
def test_a_protocol_that_cannot_give_a_verdict_is_refused_before_anything_trains(arguments, message, capsys,
                                                                                 monkeypatch):
    """A tuning round of another family than the suite's; PPO itself as the candidate; an --out that cannot be made;
    a preset the round has no search space for."""
    from benchmarks import verdict
    from benchmarks.verdict import main

    def no_step(command):
        raise AssertionError(f"a step ran: {command}")

    monkeypatch.setattr(verdict, "run", no_step)
    with pytest.raises(SystemExit) as stop:
        main(arguments)
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"python -m benchmarks.verdict: error: {message}"


STEP_STOPPING_AFTER_ITS_ITERATION = """
import os, pathlib, signal, sys, time
received = []
signal.signal(signal.SIGINT, lambda *_: received.append(True))
for pid in (os.getppid(), os.getpid()):  # Ctrl-C, as a terminal sends it to the command and its steps
    os.kill(pid, signal.SIGINT)
time.sleep(1.0)  # the iteration under way, then its checkpoint
pathlib.Path(sys.argv[1]).write_text("checkpointed" if received else "no signal")
sys.exit(130)
"""


def test_ctrl_c_lets_the_steps_runs_checkpoint_before_the_command_stops(tmp_path, capsys):
    """Ctrl-C reaches the verdict command and the run it is waiting for: the command waits for the run to finish its
    iteration and checkpoint (subprocess.run would kill it a quarter of a second later), then says how to resume."""
    import signal

    from benchmarks.verdict import run

    marker = tmp_path / "marker"
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, whatever pytest set
    try:
        with pytest.raises(SystemExit) as stopped:
            run([sys.executable, "-c", STEP_STOPPING_AFTER_ITS_ITERATION, str(marker)])
    except KeyboardInterrupt:  # left to propagate, it would stop the test session itself
        pytest.fail(f"Ctrl-C escaped the command as a KeyboardInterrupt; the step wrote {marker.read_text()!r}"
                    if marker.exists() else "Ctrl-C escaped the command as a KeyboardInterrupt; the step was killed")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert stopped.value.code == 130 and marker.read_text() == "checkpointed"
    assert "; rerun this command to resume" in capsys.readouterr().err


def test_the_best_values_are_read_from_the_projects_study_whatever_the_current_directory(tmp_path, monkeypatch):
    """The study step runs in the project root, so a relative storage (the tuning rounds' own) is the project's."""
    from benchmarks.verdict import best_overrides

    monkeypatch.chdir(tmp_path)
    values = best_overrides("classic", "ppo_kl", [])
    assert [value.split("=")[0] for value in values] == ["algo.kl_target", "algo.kl_beta_init"]


def test_a_verdict_without_a_study_runs_its_final_evaluation_on_the_presets_own_values(tmp_path, monkeypatch,
                                                                                       capsys):
    """--tune none (a family no tuning round tunes, such as the token tasks): no study step, the candidate's final
    runs on its preset's values, then the same comparison - here on the committed runs of ppo_kl's classic verdict,
    the steps recorded instead of run: its numbers are that verdict's."""
    from benchmarks import verdict
    from benchmarks.tuning import PROJECT_ROOT

    commands = []
    monkeypatch.setattr(verdict, "run", commands.append)
    stored = PROJECT_ROOT / "results" / "verdicts" / "ppo_kl_classic_10seeds"
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "runs").symlink_to(stored / "runs")
    verdict.main(["--algo", "ppo_kl", "--tune", "none", "--suite", "classic_10seeds", "--out", str(tmp_path / "out")])
    assert [command[2:] for command in commands] == [
        ["-m", "+experiment=classic_10seeds", "algo=ppo_kl", f"hydra.sweep.dir={tmp_path / 'out' / 'runs'}"],
        ["-m", "+experiment=classic_10seeds", "algo=ppo"]]  # no study, no study values
    assert "== 1/3: no study (--tune none): ppo_kl runs on its own values" in capsys.readouterr().out
    text = (tmp_path / "out" / "verdict.md").read_text()
    assert text.startswith(f"# Does ppo_kl beat PPO?\n\nMade by `python -m benchmarks.verdict --algo ppo_kl --tune none "
                           f"--suite classic_10seeds --out {tmp_path / 'out'}`: no study (`--tune none`), the final "
                           f"evaluation of conf/experiment/classic_10seeds.yaml on the preset's own values. ")
    # its values are a study's best (conf/algo/ppo_kl.yaml): said as such, not as a study this command ran
    assert "\n\nTuning (no study run by this command: the studies whose best values the runs hold): ppo_kl: " in text
    numbers = ["group", "metric", "tasks", "seeds", "value", "ci_low", "ci_high", "verdict"]
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "out" / "verdict.csv")[numbers],
                                  pd.read_csv(stored / "verdict.csv")[numbers])


def test_every_committed_verdicts_table_is_its_csv_as_the_command_writes_it():
    """verdict.md's table is verdict.csv's numbers to three decimals, the per-task ratios as written: also where a
    group has one task, whose single ratio markdown would otherwise parse and print as 2.770 beside a value of
    2.771."""
    from benchmarks.tuning import PROJECT_ROOT
    from benchmarks.verdict import markdown_table

    stored = sorted((PROJECT_ROOT / "results" / "verdicts").glob("*/verdict.csv"))
    assert len(stored) >= 3
    for path in stored:
        table = pd.read_csv(path, keep_default_na=False)
        assert markdown_table(table.drop(columns=["tuning"])) in path.with_name("verdict.md").read_text(), path
    one_task = pd.DataFrame({"metric": ["seed std"], "value": [2.770982914934275], "per_task": ["2.77"]})
    assert markdown_table(one_task).splitlines()[-1] == "| seed std |   2.771 | 2.77       |"


def test_a_failed_step_stops_the_verdict_naming_the_step_and_what_to_do():
    from benchmarks.verdict import run

    step = [sys.executable, "-c", "raise SystemExit(3)"]
    with pytest.raises(SystemExit) as stopped:
        run(step)
    assert stopped.value.code == (f"error: step failed (exit 3): {' '.join(step)}; its output above says why: a "
                                  f"refused config needs other arguments, anything else resumes where it stopped when "
                                  f"this command is rerun")


def test_a_study_without_a_complete_trial_or_runs_without_enough_seeds_give_no_verdict_in_one_line(tmp_path,
                                                                                                   monkeypatch):
    """The two ends of the protocol with nothing to judge: a study whose trials were all pruned has no best values
    to evaluate (rerun: the study goes on), and a suite without enough complete seeds of both presets on any task
    has nothing to compare (here no runs at all: the steps are recorded instead of run)."""
    import optuna

    from benchmarks import verdict

    storage = f"sqlite:///{tmp_path}/study.db"
    study = optuna.create_study(study_name="ppo_kl", storage=storage, direction="maximize")
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.PRUNED, params={}, distributions={}))
    with pytest.raises(SystemExit) as no_trial:
        verdict.best_overrides("classic", "ppo_kl", [f"hydra.sweeper.storage={storage}"])
    assert str(no_trial.value) == "error: study ppo_kl of --tune classic has no complete trial: rerun to go on with it"

    monkeypatch.setattr(verdict, "run", lambda command: None)
    with pytest.raises(SystemExit) as no_runs:
        verdict.main(["--algo", "ppo_kl", "--tune", "none", "--suite", "classic_10seeds", "--out", str(tmp_path / "out"),
                      "--suite-args", f"hydra.sweep.dir={tmp_path / 'suite'}"])
    assert str(no_runs.value) == (f"error: no task has enough complete seeds of both ppo_kl ({tmp_path / 'out' / 'runs'}) "
                                  f"and ppo ({tmp_path / 'suite'})")


def test_a_verdict_over_runs_of_two_configurations_of_the_candidate_is_refused(tmp_path, monkeypatch):
    """Runs of an earlier study's values beside the new ones (each in its own directory) would be averaged as seeds
    of one configuration: refused in one line naming two of them and the key they differ in."""
    from test_summarize import write_run

    from benchmarks import verdict

    runs = tmp_path / "out" / "runs" / "CartPole" / "ppo_kl"
    for seed, (where, kl_target) in enumerate([("earlier", 0.01), ("now", 0.02)]):
        write_run(runs / where / f"seed{seed}", seed, env="CartPole", algo="ppo_kl",
                  config={"algo": {"algorithm": "ppo_kl", "kl_target": kl_target}, "env": {}})
    monkeypatch.setattr(verdict, "run", lambda command: None)
    with pytest.raises(SystemExit) as refused:
        verdict.main(["--algo", "ppo_kl", "--tune", "none", "--suite", "classic_10seeds", "--out", str(tmp_path / "out"),
                      "--suite-args", f"hydra.sweep.dir={tmp_path / 'suite'}"])
    assert str(refused.value) == (f"error: CartPole/ppo_kl holds runs of more than one configuration ({runs / 'earlier'}"
                                  f"/seed0 and {runs / 'now'}/seed1 differ in: algo.kl_target): a table takes the "
                                  f"seeds of one; name each configuration's directory on its own")
