"""benchmarks.reproduce: a stored run retrained from its own config gives every logged number again."""

import pytest
from conftest import QUIET

from benchmarks.reproduce import main as reproduce_main
from benchmarks.trainer import train


def test_reproduce_confirms_a_run_and_flags_another_backend(make_config, tmp_path, capsys):
    run_dir = tmp_path / "run"
    train(make_config(["env=CartPole", "algo=ppo", "seed=3", "total_steps=2048", *QUIET]), run_dir)

    with pytest.raises(SystemExit) as same:
        reproduce_main([str(run_dir)])
    out = capsys.readouterr().out
    assert same.value.code == 0
    assert "same train.csv: 4 rows, every number identical" in out and "1 of 1 runs reproduce" in out

    with pytest.raises(SystemExit) as other:
        reproduce_main([str(run_dir), "--set", "algo.backend=numpy"])  # other float rounding
    out = capsys.readouterr().out
    assert other.value.code == 1
    assert "DIFF train.csv" in out and "0 of 1 runs reproduce" in out
