"""tests/commands.py: a command run from the tests' fork server gives what a fresh interpreter gives."""

import json
import os
import subprocess
import sys

import pytest

from tests.commands import PRELOADED, ROOT, run_python

PROBE = str(ROOT / "tests" / "command_probe.py")


def without_the_server_mark(result: subprocess.CompletedProcess) -> tuple:
    said = json.loads(result.stdout.splitlines()[0])
    return said.pop("torch_already_imported"), (result.returncode, said, result.stdout.splitlines()[1:],
                                                result.stderr)


@pytest.mark.parametrize("arguments", [[PROBE], [PROBE, "3"], ["tests/command_probe.py", "raise"]])
def test_a_command_from_the_server_gets_what_a_fresh_interpreter_gives(arguments, tmp_path):
    """argv, sys.path[0], __file__, __name__, working directory, empty stdin, stdout and stderr (universal
    newlines), exit status, an uncaught exception's traceback and exit status 1."""
    cwd = ROOT if not arguments[0].startswith("/") else tmp_path
    served = run_python([sys.executable, *arguments], cwd=cwd, timeout=60)
    fresh = subprocess.run([sys.executable, *arguments], cwd=cwd, capture_output=True, text=True, timeout=60)
    preloaded, served = without_the_server_mark(served)
    assert preloaded  # it did come from the server
    was_preloaded, fresh = without_the_server_mark(fresh)
    assert not was_preloaded
    if arguments[-1] == "raise":  # the traceback has the server's frames above the command's
        assert served[3].startswith("to stderr\nline\nTraceback (most recent call last):\n")
        assert served[3].splitlines()[-3:] == fresh[3].splitlines()[-3:]
        assert fresh[3].endswith('    raise ValueError("raised by the command")\nValueError: raised by the command\n')
        served, fresh = served[:3], fresh[:3]
    assert served == fresh


def test_a_module_from_the_server_gets_what_python_m_gives():
    served = run_python([sys.executable, "-m", "benchmarks.summarize", "/no/such/dir"], cwd=ROOT, timeout=60)
    fresh = subprocess.run([sys.executable, "-m", "benchmarks.summarize", "/no/such/dir"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert (served.returncode, served.stdout, served.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert served.returncode == 2 and "does not exist" in served.stderr


def test_an_environment_the_server_was_not_started_in_runs_a_fresh_interpreter(monkeypatch):
    """POPULATION_COMPILE is read when a run starts: the server's command takes it; anything else is settled as
    Python starts, so such a command is not forked from the server; nor any when TESTS_FORK_SERVER=0."""
    compiled = run_python([sys.executable, PROBE], env={**os.environ, "POPULATION_COMPILE": "1"}, timeout=60)
    said = json.loads(compiled.stdout.splitlines()[0])
    assert said["compile"] == "1" and said["torch_already_imported"]
    other = run_python([sys.executable, PROBE], env={**os.environ, "OPENBLAS_NUM_THREADS": "2"}, timeout=60)
    assert not json.loads(other.stdout.splitlines()[0])["torch_already_imported"]
    monkeypatch.setenv("TESTS_FORK_SERVER", "0")
    assert not json.loads(run_python([sys.executable, PROBE], timeout=60).stdout.splitlines()[0])[
        "torch_already_imported"]


def test_a_command_past_its_timeout_is_killed_as_subprocess_run_kills_it():
    with pytest.raises(subprocess.TimeoutExpired) as expired:
        run_python([sys.executable, PROBE, "sleep"], timeout=3)
    assert expired.value.stderr == b"to stderr\r\nline\n"  # as subprocess.run's: the bytes
    assert run_python([sys.executable, PROBE, "5"], timeout=60).returncode == 5  # and the server serves on


def test_nothing_the_server_preloads_starts_a_thread():
    """A fork copies only the thread that forks: a preloaded module's thread would be missing in every command."""
    imports = "; ".join(f"import {name}" for name in PRELOADED)
    counted = subprocess.run([sys.executable, "-c", f"{imports}; import os; print(len(os.listdir('/proc/self/task')))"],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert counted.stdout.strip() == "1", counted.stderr
