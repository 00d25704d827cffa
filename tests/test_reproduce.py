"""benchmarks.reproduce: a stored run retrained from its own config gives every logged number again."""

import pytest
from conftest import QUIET

from benchmarks.reproduce import main as reproduce_main
from benchmarks.engine.trainer import train


def test_reproduce_confirms_a_run_and_flags_another_backend(make_config, tmp_path, capsys):
    run_dir = tmp_path / "run"
    train(make_config(["env=CartPole", "algo=ppo", "algo.backend=torch", "seed=3", "total_steps=2048", *QUIET]), run_dir)

    with pytest.raises(SystemExit) as same:
        reproduce_main([str(run_dir)])
    out = capsys.readouterr().out
    assert same.value.code == 0
    assert "same train.csv: 4 rows, every number identical" in out and "1 of 1 runs reproduce" in out
    assert "note:" not in out  # same machine: nothing to say

    with pytest.raises(SystemExit) as other:
        reproduce_main([str(run_dir), "--set", "algo.backend=numpy"])  # other float rounding
    out = capsys.readouterr().out
    assert other.value.code == 1
    assert "DIFF train.csv" in out and "0 of 1 runs reproduce" in out


def test_a_run_records_its_cpu_and_reproduce_says_when_it_compares_across_cpus(make_config, tmp_path):
    import json

    from benchmarks.reproduce import machine_note
    from benchmarks.engine.trainer import machine

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


def test_profile_attributes_samples_to_the_loop_phases():
    from benchmarks.speed.profile import phase_of

    def stack(*below_train):
        return ["<module> (run.py:120)", "main (run.py:50)", "train (benchmarks/engine/trainer.py:329)", *below_train]

    assert phase_of(stack("VectorActionWrapper.step (gymnasium/vector/vector_env.py:623)")) == "env step (with wrappers)"
    assert phase_of(stack("PPO.act (algorithms/ppo.py:56)")) == "act"
    assert phase_of(stack("PPO.update (algorithms/ppo.py:105)", "PPO.run_epochs (algorithms/ppo.py:127)",
                          "PPO.minibatch_step (algorithms/ppo.py:139)",
                          "Optimizer.profile_hook_step.<locals>.wrapper (torch/optim/optimizer.py:530)")
                    ) == "update: optimizer step"
    assert phase_of(stack("OuterPPO.update (algorithms/outer_ppo.py:115)", "PPO.run_epochs (algorithms/ppo.py:127)",
                          "PPO.minibatch_step (algorithms/ppo.py:139)")) == "update: minibatch loss + gradient"
    assert phase_of(stack("build_algorithm (algorithms/__init__.py:13)")) == "start-up"
    assert phase_of(stack()) == "training loop (itself)"
    assert phase_of(["<module> (run.py:1)", "_find_and_load (<frozen importlib._bootstrap>:1176)"]) is None
