"""Portable numerics: SUITE_NUMERICS pins every library's float kernels before numpy and torch load."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks import numerics
from tests.conftest import QUIET, ROOT

PROBE = ("import json, benchmarks.numerics as n; r = n.kernel_record(); "
         "print(json.dumps({'mode': r['mode'], 'torch': r['torch_cpu_capability'], 'simd': r['numpy_simd'], "
         "'openblas': r['openblas_core']}))")


def kernels_in_child(mode: str, **variables: str) -> dict:
    environment = {**numerics.environment_for(mode), **variables}
    child = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=environment, capture_output=True,
                           text=True, check=True)
    return json.loads(child.stdout)


requires_avx2 = pytest.mark.skipif(not {"avx2", "fma"} <= numerics.cpu_flags(), reason="CPU without AVX2/FMA")


@requires_avx2
def test_portable_mode_pins_torch_numpy_and_openblas_to_avx2_kernels():
    kernels = kernels_in_child("portable")
    assert kernels["mode"] == "portable"
    assert kernels["torch"] == "AVX2"
    assert kernels["openblas"] == "Haswell"
    assert "X86_V4" not in kernels["simd"] and not any("AVX512" in feature for feature in kernels["simd"])


@pytest.mark.skipif("avx512f" not in numerics.cpu_flags(), reason="only an AVX-512 CPU has wider kernels to give up")
def test_native_mode_lets_each_library_take_the_widest_kernels():
    kernels = kernels_in_child("native")
    assert kernels["mode"] == "native"
    assert kernels["torch"] == "AVX512" and "X86_V4" in kernels["simd"]
    # OpenBLAS's own pick: wider than Haswell's on Intel; on AMD's Zen cores its choice is the Haswell kernels
    amd = "AuthenticAMD" in open("/proc/cpuinfo").read()
    assert kernels["openblas"] != "Haswell" or amd


@pytest.mark.skipif("avx512f" not in numerics.cpu_flags(), reason="only an AVX-512 CPU has wider kernels to give up")
def test_a_native_child_of_a_portable_process_drops_the_inherited_pins():
    """A child that inherits this (portable) process's environment as it is, with SUITE_NUMERICS=native."""
    import os

    pinned = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True,
                            env={**os.environ, numerics.MODE_VARIABLE: "portable"})
    assert json.loads(pinned.stdout)["torch"] == "AVX2"
    native = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True,
                            env={**os.environ, numerics.MODE_VARIABLE: "native"})
    assert json.loads(native.stdout)["torch"] == "AVX512"


@requires_avx2
def test_a_worker_that_loads_numpy_first_with_the_pins_inherited_runs_pinned_and_says_nothing():
    """A launcher's worker (joblib's loky) imports numpy before the suite, but its environment already holds the
    parent's pins: its kernels are pinned and nothing is said. Without them, the late pin is said."""
    probe = "import numpy; " + PROBE
    unpinned = {k: v for k, v in numerics.environment_for("portable").items()
                if k not in numerics.PORTABLE_KERNELS and k != numerics.PINNED_VARIABLE}
    inherited = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True,
                               env={**unpinned, **numerics.PORTABLE_KERNELS})
    assert json.loads(inherited.stdout)["torch"] == "AVX2" and "loaded before" not in inherited.stderr
    bare = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True,
                          env=unpinned)
    assert "numerics: numpy loaded before the kernels were pinned; import benchmarks first" in bare.stderr


@requires_avx2
def test_a_variable_the_user_set_is_kept():
    assert kernels_in_child("portable", ATEN_CPU_CAPABILITY="default")["torch"] == "DEFAULT"


@pytest.mark.parametrize("mode", ["portable", "native"])
def test_numpys_blas_runs_on_one_thread_unless_the_user_says_otherwise(mode):
    probe = "import benchmarks.numerics as n; print(n.openblas_threads())"
    environment = {key: value for key, value in numerics.environment_for(mode).items() if key != "OPENBLAS_NUM_THREADS"}
    import os

    for given, expected in ((None, "1"), ("2", str(min(2, os.cpu_count())))):  # OpenBLAS: at most one per core
        child = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True,
                               env=environment if given is None else {**environment, "OPENBLAS_NUM_THREADS": given})
        assert child.stdout.strip() == expected


def test_an_unknown_mode_is_one_line_and_exit_2():
    child = subprocess.run([sys.executable, "run.py", "env=CartPole", "total_steps=512"], cwd=ROOT,
                           env={**numerics.environment_for("native"), numerics.MODE_VARIABLE: "fast"},
                           capture_output=True, text=True)
    assert child.returncode == 2
    assert child.stderr.strip() == "SUITE_NUMERICS='fast' is not a numerics mode: use one of portable, native"


def test_a_run_records_its_kernel_mode(make_config, tmp_path):
    from benchmarks.engine.trainer import train

    train(make_config(["env=CartPole", "total_steps=512", *QUIET]), tmp_path / "run")
    record = json.loads((tmp_path / "run" / "summary.json").read_text())["machine"]["numerics"]
    assert record["mode"] == numerics.MODE
    assert set(record["variables"]) == set(numerics.PORTABLE_KERNELS)


def test_a_checkpoint_of_the_other_mode_is_refused_with_the_way_to_resume_it(make_config, tmp_path):
    from benchmarks.engine.checkpoint import CheckpointError, read_checkpoint, save_checkpoint_file
    from benchmarks.engine.trainer import train

    cfg = make_config(["env=CartPole", "total_steps=1024", "env.num_steps=128", *QUIET])
    run_dir = tmp_path / "run"
    train(cfg, run_dir)
    path = run_dir / "checkpoint.pt"
    checkpoint = read_checkpoint(path)
    other = "native" if numerics.base_mode(numerics.MODE) == "portable" else "portable"
    save_checkpoint_file({**checkpoint, "numerics": other}, path)
    (run_dir / "summary.json").unlink()  # an interrupted run: it resumes from the checkpoint
    with pytest.raises(CheckpointError, match=f"was written with {other} float kernels and this process has "
                                              f"{numerics.base_mode(numerics.MODE)} ones: rerun with "
                                              f"SUITE_NUMERICS={other} to resume it exactly"):
        train(cfg, run_dir)


@pytest.mark.slow
@pytest.mark.skipif("avx512f" not in numerics.cpu_flags(), reason="on an AVX2-only CPU both modes use one kernel set")
def test_reproduce_reruns_a_run_in_the_mode_it_was_made_in(make_config, tmp_path):
    """A portable run relabelled 'native' is rerun by a native child: on this AVX-512 CPU its numbers differ,
    which shows both that reproduce switches mode and that the mode changes the kernels."""
    from benchmarks.engine.trainer import train

    run_dir = tmp_path / "run"
    train(make_config(["env=Pendulum", "total_steps=2048", "env.num_steps=256", *QUIET]), run_dir)
    same = subprocess.run([sys.executable, "-m", "benchmarks.reproduce", str(run_dir)], cwd=ROOT,
                          env=numerics.environment_for(numerics.MODE), capture_output=True, text=True)
    assert same.returncode == 0 and "1 of 1 runs reproduce" in same.stdout, same.stdout + same.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    other = "native" if numerics.base_mode(numerics.MODE) == "portable" else "portable"
    summary["machine"]["numerics"]["mode"] = other
    (run_dir / "summary.json").write_text(json.dumps(summary))
    relabelled = subprocess.run([sys.executable, "-m", "benchmarks.reproduce", str(run_dir)], cwd=ROOT,
                                env=numerics.environment_for(numerics.MODE), capture_output=True, text=True)
    assert f"1 run(s) were made with {other} kernels: rerunning them in a child process" in relabelled.stdout
    assert relabelled.returncode == 1 and "0 of 1 runs reproduce" in relabelled.stdout, relabelled.stdout
