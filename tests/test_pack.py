"""Packing a suite's logs into Parquet: every number read back exactly as pandas read the CSV, only complete runs
moved, packing again adds and replaces, plain CSVs win over packed rows, and a log it cannot store is refused."""

import gzip
import json
import math

import numpy as np
import pandas as pd
import pytest

from benchmarks.engine.logger import CSVLog, episode_statistics, read_csv_complete_rows
from benchmarks.pack import main as pack_main
from benchmarks.pack import read_suite_log
from benchmarks.runs import LAST_EPISODES, load_runs

LOGS = ("train.csv", "eval.csv", "episodes.csv")


def write_run(run_dir, seed, status="complete", extra=None):
    """A run directory as the trainer leaves it: summary.json and three CSVs written by the suite's own CSVLog."""
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps({
        "status": status, "env": "CartPole", "algo": "ppo", "seed": seed, "env_steps": 4096, "sps": 1000.0,
        "config": {}}))
    for name in LOGS:
        log = CSVLog(run_dir / name)
        for i in range(1, 5):
            row = {"env_steps": 1024 * i, "iteration": i, "eval_return_mean": 0.1 * i + seed / 3,
                   "episode_return": -(i ** 0.5) * 1e-7, "rollout_time": 0.0, "update_time": 1 / 7,
                   "approx_kl": math.nan if i == 1 else 2.0 ** -30 * i, "ratio_max": math.inf,
                   "lr": 3e-4, "episodes": i * 2 + seed}
            row.update(extra or {})
            log.write(row)
        log.close()


def read_all(run_dirs):
    return {(run_dir, name): read_csv_complete_rows(run_dir / name) for run_dir in run_dirs for name in LOGS}


def assert_same(before, after):
    assert before.keys() == after.keys()
    for key in before:
        pd.testing.assert_frame_equal(after[key], before[key], check_exact=True)


def test_packed_logs_read_back_exactly_and_only_complete_runs_move(tmp_path):
    suite = tmp_path / "suite"
    runs = [suite / "CartPole" / "ppo" / f"seed{seed}" for seed in (0, 1)]
    for seed, run_dir in enumerate(runs):
        write_run(run_dir, seed)
    running = suite / "CartPole" / "ppo" / "seed2"
    write_run(running, 2, status="interrupted")
    before = read_all([*runs, running])
    suite_runs_before = load_runs(suite)

    pack_main([str(suite)])

    for run_dir in runs:
        assert sorted(p.name for p in run_dir.iterdir()) == ["summary.json"]
    assert sorted(p.name for p in running.iterdir()) == ["episodes.csv", "eval.csv", "summary.json", "train.csv"]
    assert_same(before, read_all([*runs, running]))
    after = load_runs(suite)
    assert [(r["seed"], r["dir"]) for r in after] == [(r["seed"], r["dir"]) for r in suite_runs_before]
    for old, new in zip(suite_runs_before, after):
        pd.testing.assert_frame_equal(new["eval"], old["eval"], check_exact=True)


def test_runs_not_complete_are_named_as_left_unpacked(tmp_path, capsys):
    """Packing before a commit while a sweep still runs (or with a run to rerun) says which runs it left as they
    are: training (a checkpoint and logs, no summary yet), interrupted, failed."""
    suite = tmp_path / "suite"
    write_run(suite / "CartPole" / "ppo" / "seed0", 0)
    write_run(suite / "CartPole" / "ppo" / "seed1", 1, status="interrupted")
    write_run(suite / "CartPole" / "ppo" / "seed2", 2, status="failed")
    training = suite / "Acrobot" / "ppo" / "seed0"
    training.mkdir(parents=True)
    (training / "checkpoint.pt").write_bytes(b"")
    pack_main([str(suite)])
    assert capsys.readouterr().out.splitlines() == [
        f"{suite}: 3 run(s) not complete, left as they are (rerun their command to finish them, then pack again): "
        f"Acrobot/ppo/seed0, CartPole/ppo/seed1, CartPole/ppo/seed2",
        "packed 1 runs, 0.0 MB more (tables' overhead on small logs)"]


def test_packing_again_adds_new_runs_and_plain_csvs_win(tmp_path):
    suite = tmp_path / "suite"
    first = suite / "Pendulum" / "ppo" / "seed0"
    write_run(first, 0)
    pack_main([str(suite)])
    packed_first = read_all([first])

    second = suite / "Pendulum" / "ppo" / "seed1"
    write_run(second, 1, extra={"outer_lr": 0.5, "outer_steps": 3})  # more columns: the table takes their union
    expected_second = read_all([second])
    pack_main([str(suite)])
    assert_same({**packed_first, **expected_second}, read_all([first, second]))
    assert "outer_lr" not in read_csv_complete_rows(first / "train.csv").columns

    (first / "train.csv").write_text("env_steps,iteration\n8,1\n")  # the run trained again: its new CSV is read
    assert read_csv_complete_rows(first / "train.csv").to_dict("list") == {"env_steps": [8], "iteration": [1]}
    pack_main([str(suite)])  # and packing again replaces its stored rows
    assert not (first / "train.csv").exists()
    assert read_csv_complete_rows(first / "train.csv").to_dict("list") == {"env_steps": [8], "iteration": [1]}


def test_runs_packed_as_gzip_move_into_the_suite_file(tmp_path):
    suite = tmp_path / "suite"
    run_dir = suite / "CartPole" / "ppo" / "seed0"
    write_run(run_dir, 0)
    before = read_all([run_dir])
    for name in ("train.csv", "episodes.csv"):  # how an earlier version of the command left committed runs
        (run_dir / (name + ".gz")).write_bytes(gzip.compress((run_dir / name).read_bytes(), mtime=0))
        (run_dir / name).unlink()
    pack_main([str(suite)])
    assert sorted(p.name for p in run_dir.iterdir()) == ["summary.json"]
    assert_same(before, read_all([run_dir]))


def test_text_and_numbers_in_one_column_are_refused_in_one_line(tmp_path, capsys):
    suite = tmp_path / "suite"
    write_run(suite / "a" / "seed0", 0, extra={"note": "fell"})
    write_run(suite / "a" / "seed1", 1, extra={"note": 3.5})
    pack_main([str(suite)])
    out = capsys.readouterr().out
    assert "column 'note' of train.csv holds text in one run and numbers in another; that log was not packed" in out
    assert (suite / "a" / "seed0" / "train.csv").exists() and (suite / "a" / "seed1" / "train.csv").exists()


def test_a_log_in_no_file_and_no_suite_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="seed0/train.csv: no such file, and no packed log"):
        read_csv_complete_rows(tmp_path / "seed0" / "train.csv")


def test_unpacking_writes_the_same_numbers_back_as_csvs(tmp_path):
    suite = tmp_path / "suite"
    runs = [suite / "CartPole" / "ppo" / f"seed{seed}" for seed in (0, 1)]
    for seed, run_dir in enumerate(runs):
        write_run(run_dir, seed, extra={"note": "text, with a comma"})
    before = read_all(runs)
    pack_main([str(suite)])
    pack_main(["--unpack", str(suite)])
    assert not (suite / "logs").exists()
    assert sorted(p.name for p in runs[0].iterdir()) == ["episodes.csv", "eval.csv", "summary.json", "train.csv"]
    for key, frame in before.items():  # read from the CSVs alone, not from a cache of the removed file
        unpacked = pd.read_csv(key[0] / key[1], float_precision="round_trip")
        pd.testing.assert_frame_equal(unpacked, frame, check_exact=True)


def test_the_reader_parses_repr_floats_exactly(tmp_path):
    """pandas' default float parser can be one unit in the last place off: what is packed and compared must be
    the number the run computed."""
    (tmp_path / "train.csv").write_text("x\n0.30000000000000004\n2.3976970769999757\n")
    assert read_csv_complete_rows(tmp_path / "train.csv")["x"].tolist() == [0.30000000000000004, 2.3976970769999757]


def test_a_run_directory_or_a_suite_in_a_packed_one_is_refused_in_one_line(tmp_path, capsys):
    suite = tmp_path / "outer" / "inner"
    write_run(suite / "seed0", 0)
    pack_main([str(suite / "seed0")])  # a run's directory: its logs would lie where no reader looks
    assert "seed0 is a run's directory: pack the suite that holds it" in capsys.readouterr().out
    assert (suite / "seed0" / "train.csv").exists()
    pack_main([str(suite)])
    write_run(tmp_path / "outer" / "other" / "seed0", 0)
    pack_main([str(tmp_path / "outer")])  # its rows would be shadowed by, or shadow, the inner suite's
    assert "inner is a packed suite in or around it; pack that one" in capsys.readouterr().out
    assert (tmp_path / "outer" / "other" / "seed0" / "train.csv").exists()


def test_runs_without_rows_and_runs_gone_are_handled(tmp_path, capsys):
    suite = tmp_path / "suite"
    write_run(suite / "seed0", 0)
    write_run(suite / "seed1", 1)
    (suite / "seed1" / "episodes.csv").write_text("env_steps,episode_return,episode_length\n")  # no episode ended
    before = read_all([suite / "seed0", suite / "seed1"])
    pack_main([str(suite)])
    assert "not packed" not in capsys.readouterr().out
    assert_same(before, read_all([suite / "seed0", suite / "seed1"]))
    assert list(read_csv_complete_rows(suite / "seed1" / "episodes.csv").columns) == [
        "env_steps", "episode_return", "episode_length"]

    import shutil

    shutil.rmtree(suite / "seed0")  # a run deleted: packing again drops its rows
    pack_main([str(suite)])
    for name in LOGS:
        assert sorted(read_suite_log(suite / "logs" / name.replace(".csv", ".parquet"))) == ["seed1"]
    assert_same({k: v for k, v in before.items() if k[0].name == "seed1"}, read_all([suite / "seed1"]))


def write_trained_run(run_dir, seed, returns_per_iteration):
    """A run whose train.csv summarises each iteration's episodes as the trainer does (episode_statistics of the
    episodes it logs at that iteration's env_steps into episodes.csv); an iteration may finish none."""
    write_run(run_dir, seed)
    rng = np.random.default_rng(seed)
    for name in ("train.csv", "episodes.csv"):
        (run_dir / name).unlink()
    train, episodes = CSVLog(run_dir / "train.csv"), CSVLog(run_dir / "episodes.csv")
    for iteration, count in enumerate(returns_per_iteration, start=1):
        returns = list(rng.normal(1000.0, 300.0, count))
        lengths = [int(n) for n in rng.integers(1, 1000, count)]
        for ret, length in zip(returns, lengths):
            episodes.write({"env_steps": 2048 * iteration, "episode_return": ret, "episode_length": length})
        train.write({"env_steps": 2048 * iteration, "iteration": iteration, "wall_time": iteration / 3,
                     **episode_statistics(returns, lengths), "approx_kl": 0.01 / iteration})
    train.close()
    episodes.close()


def test_a_packed_run_keeps_its_last_100_episodes_and_its_train_statistics(tmp_path):
    import pyarrow.parquet as pq

    suite = tmp_path / "suite"
    runs = [suite / "Hopper" / "ppo" / f"seed{seed}" for seed in (0, 1)]
    write_trained_run(runs[0], 0, [0, 70, 1, 52, 0, 3])  # 126 episodes: the first 26 are not kept
    write_trained_run(runs[1], 1, [40, 0, 9])  # 49: every one kept
    before = read_all(runs)
    episodes = before[(runs[0], "episodes.csv")]
    assert len(episodes) == 126

    pack_main([str(suite)])

    after = read_all(runs)
    pd.testing.assert_frame_equal(after[(runs[0], "episodes.csv")], episodes.tail(100).reset_index(drop=True),
                                  check_exact=True)
    assert_same({key: frame for key, frame in before.items() if key != (runs[0], "episodes.csv")},
                {key: frame for key, frame in after.items() if key != (runs[0], "episodes.csv")})
    stored = pq.read_table(suite / "logs" / "train.parquet").to_pandas()  # every iteration's statistics, stored
    assert stored["episode_return_mean"].notna().sum() == 4 + 2
    assert str(pq.read_schema(suite / "logs" / "train.parquet").field("wall_time").type) == "float"  # float32

    pack_main(["--unpack", str(suite)])
    unpacked = pd.read_csv(runs[0] / "episodes.csv", float_precision="round_trip")
    pd.testing.assert_frame_equal(unpacked, episodes.tail(100).reset_index(drop=True), check_exact=True)
    pd.testing.assert_frame_equal(pd.read_csv(runs[0] / "train.csv", float_precision="round_trip"),
                                  before[(runs[0], "train.csv")], check_exact=True)


def test_a_table_whose_train_statistics_recompute_from_every_episode_is_named_in_one_line(tmp_path, capsys):
    import pyarrow.parquet as pq

    suite = tmp_path / "suite"
    write_trained_run(suite / "seed0", 0, [3, 2])
    pack_main([str(suite)])
    table = pq.read_table(suite / "logs" / "train.parquet")
    described = json.loads(table.schema.metadata[b"benchmarks.pack"])
    described["derived"] = {"seed0": ["episode_return_mean"]}  # how that form marked recomputed columns
    pq.write_table(table.replace_schema_metadata({b"benchmarks.pack": json.dumps(described).encode()}),
                   suite / "logs" / "train.parquet")
    capsys.readouterr()
    pack_main(["--repack", str(suite)])
    assert capsys.readouterr().out.splitlines()[0] == (
        f"not packed: {suite / 'logs' / 'train.parquet'}: its train statistics are to be recomputed from every "
        f"episode, a form this benchmarks.pack does not read; unpack it with the one of commit c282045b, then pack it")


def test_numpy_and_torch_scalars_are_logged_as_the_numbers_they_are(tmp_path):
    """A statistic a variant returns as a numpy or torch scalar is logged as its number, exactly, not as its repr
    ('np.float64(0.1)', 'tensor(0.5000)'), which would make the column text."""
    import torch

    log = CSVLog(tmp_path / "train.csv")
    log.write({"a": np.float64(0.1) + np.float64(0.2), "b": np.float64("inf"), "c": torch.tensor(0.1),
               "d": np.int64(3), "e": torch.tensor(7), "f": 0.5})
    log.close()
    assert (tmp_path / "train.csv").read_text() == "a,b,c,d,e,f\n0.30000000000000004,inf,0.10000000149011612,3,7,0.5\n"


def test_a_log_given_its_header_names_its_columns_before_any_row_and_after_a_resume_cut_to_it(tmp_path):
    path, header = tmp_path / "episodes.csv", ("env_steps", "episode_return", "episode_length")
    log = CSVLog(path, header=header)
    at_start = log.size()
    log.close()
    assert path.read_text() == "env_steps,episode_return,episode_length\n" and at_start == len(path.read_bytes())
    path.write_text("")  # a checkpoint from before the header was written at the start: resumed, nothing written
    CSVLog(path, 0, header=header).close()
    assert path.read_text() == "env_steps,episode_return,episode_length\n"
    for resume_at in (at_start, 0):  # a checkpoint before any row; one from before the header was written at start
        log = CSVLog(path, resume_at, header=header)
        log.write({"env_steps": 128, "episode_return": -1.5, "episode_length": 128})
        log.close()
        assert path.read_text() == "env_steps,episode_return,episode_length\n128,-1.5,128\n"
        path.write_text("env_steps,episode_return,episode_length\n")


def test_a_pack_that_fails_part_way_changes_no_table_and_no_csv(tmp_path, capsys):
    suite = tmp_path / "suite"
    for seed in (0, 1):
        write_trained_run(suite / f"seed{seed}", seed, [2, 0, 5])
    pack_main([str(suite)])
    tables = {path.name: path.read_bytes() for path in (suite / "logs").iterdir()}
    import shutil

    shutil.rmtree(suite / "seed1")  # its rows leave the tables at the next pack...
    write_trained_run(suite / "seed2", 2, [1, 1, 1])
    refused = read_csv_complete_rows(suite / "seed2" / "train.csv").assign(run="x")
    refused.to_csv(suite / "seed2" / "train.csv", index=False)  # ...which refuses seed2's train.csv
    pack_main([str(suite)])
    assert "has a column named 'run'" in capsys.readouterr().out
    assert {path.name: path.read_bytes() for path in (suite / "logs").iterdir()} == tables  # no temp file either
    assert sorted(p.name for p in (suite / "seed2").iterdir()) == ["episodes.csv", "eval.csv", "summary.json",
                                                                   "train.csv"]
    read_all([suite / "seed0", suite / "seed2"])  # every log still reads


def test_a_rewritten_episodes_log_is_read_and_repacked_and_old_tables_repack(tmp_path):
    """A run's episodes.csv written again while its logs stay packed: its new rows are read, in the same process
    that read the old ones, and packing again stores them. A table packed before timings were stored as float32
    (float64 there) reads at float32 precision and repacks."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    suite = tmp_path / "suite"
    write_trained_run(suite / "seed0", 0, [3, 2])
    before = read_all([suite / "seed0"])
    pack_main([str(suite)])
    assert_same(before, read_all([suite / "seed0"]))
    episodes = before[(suite / "seed0", "episodes.csv")].copy()
    episodes.loc[0, "episode_return"] += 1.0
    episodes.to_csv(suite / "seed0" / "episodes.csv", index=False)
    pack_main([str(suite)])
    assert_same(before | {(suite / "seed0", "episodes.csv"): episodes}, read_all([suite / "seed0"]))

    old = pq.read_table(suite / "logs" / "train.parquet")  # as an earlier version stored it: float64 timings
    old = old.set_column(old.schema.get_field_index("wall_time"), "wall_time",
                         pa.array([1 / 3, 2 / 3], type=pa.float64()))
    pq.write_table(old, suite / "logs" / "train.parquet")
    assert read_csv_complete_rows(suite / "seed0" / "train.csv")["wall_time"].tolist() == [
        float(np.float32(1 / 3)), float(np.float32(2 / 3))]
    pack_main(["--repack", str(suite)])
    assert str(pq.read_schema(suite / "logs" / "train.parquet").field("wall_time").type) == "float"


def test_every_committed_packed_table_reads_with_this_version():
    """A change of the packed form must repack every committed table (results/runs, the CI reference, the
    verdicts' runs): a table this version cannot read leaves its runs out of every report and check."""
    from tests.conftest import ROOT

    tables = sorted((ROOT / "results").rglob("logs/*.parquet"))
    assert len(tables) >= 3 * 20
    for table in tables:
        logs = read_suite_log(table)
        assert logs, table
        if table.name == "episodes.parquet":
            assert max(len(frame) for frame in logs.values()) <= LAST_EPISODES, table


def test_packing_writes_a_complete_runs_summary_on_one_line_that_reads_back_the_same(tmp_path):
    from benchmarks.engine.logger import write_json_atomic
    from benchmarks.runs import read_summary

    suite = tmp_path / "suite"
    done, running = suite / "CartPole" / "ppo" / "seed0", suite / "CartPole" / "ppo" / "seed1"
    write_run(done, 0)
    write_run(running, 1, status="interrupted")
    summary = {**read_summary(done), "wall_time_s": 6367.458508092008, "resumed_at_env_steps": [],
               "final_eval_return_std": math.nan, "phase_seconds": {"env step": 2990.6762658146763, "act": 1e-300},
               "config": {"algo": {"name": "ppo", "lr": 0.000107, "betas": [0.9, 0.999]}, "note": "é, ü"}}
    for run_dir in (done, running):
        write_json_atomic(run_dir / "summary.json", {**summary, "status": read_summary(run_dir)["status"]})
    running_before = (running / "summary.json").read_bytes()
    indented = (done / "summary.json").stat().st_size

    pack_main([str(suite)])

    text = (done / "summary.json").read_text()
    assert "\n" not in text and len(text) < 0.8 * indented
    stored = json.loads(text)
    assert list(stored) == list(summary) and math.isnan(stored.pop("final_eval_return_std"))
    assert stored == {k: v for k, v in summary.items() if k != "final_eval_return_std"}
    assert (running / "summary.json").read_bytes() == running_before  # a run that may resume keeps its file
    packed = (done / "summary.json").read_bytes()
    pack_main([str(suite)])
    assert (done / "summary.json").read_bytes() == packed
