"""tests/commands.py: a command run from the tests' fork server gives what a fresh interpreter gives."""

import json
import os
import subprocess
import sys

import pytest

from tests.commands import PRELOADED, ROOT, run_python

PROBE = str(ROOT / "tests" / "command_probe.py")
pytestmark = pytest.mark.skipif(os.environ.get("TESTS_FORK_SERVER") == "0", reason="TESTS_FORK_SERVER=0: no server")


def said(result) -> dict:
    return json.loads(result.stdout.splitlines()[0])


def without_the_pid_and_the_server_mark(result: subprocess.CompletedProcess) -> tuple:
    first = said(result)
    first.pop("pid")
    return first.pop("torch_already_imported"), (result.returncode, first, result.stdout.splitlines()[1:],
                                                 result.stderr)


@pytest.mark.parametrize("arguments, where", [
    ([PROBE], "elsewhere"), ([PROBE, "3"], "elsewhere"), (["tests/command_probe.py", "raise"], "root"),
    (["-m", "command_probe", "4"], "tests"),
])
def test_a_command_from_the_server_gets_what_a_fresh_interpreter_gives(arguments, where, tmp_path):
    """argv, sys.path[0], __file__, __name__, a namespace of its own, working directory, empty stdin, stdout and
    stderr (universal newlines), exit status, an uncaught exception's exit status 1 and its traceback."""
    cwd = {"elsewhere": tmp_path, "root": ROOT, "tests": ROOT / "tests"}[where]
    served = run_python([sys.executable, *arguments], cwd=cwd, timeout=60)
    fresh = subprocess.run([sys.executable, *arguments], cwd=cwd, capture_output=True, text=True, timeout=60)
    preloaded, served = without_the_pid_and_the_server_mark(served)
    assert preloaded  # it did come from the server
    was_preloaded, fresh = without_the_pid_and_the_server_mark(fresh)
    assert not was_preloaded
    if arguments[-1] == "raise":  # the traceback has the server's frames above the command's
        assert served[3].startswith("to stderr\nline\nTraceback (most recent call last):\n")
        assert served[3].splitlines()[-3:] == fresh[3].splitlines()[-3:]
        assert fresh[3].endswith('    raise ValueError("raised by the command")\nValueError: raised by the command\n')
        served, fresh = served[:3], fresh[:3]
    assert served == fresh


@pytest.mark.parametrize("arguments", [["-m", "benchmarks.summarize", "/no/such/dir"],
                                       [str(ROOT / "run.py"), "algo.lr=0", "hydra.run.dir=/no/such/dir"]])
def test_the_suites_commands_from_the_server_say_what_they_say_fresh(arguments):
    served = run_python([sys.executable, *arguments], cwd=ROOT, timeout=120)
    fresh = subprocess.run([sys.executable, *arguments], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (served.returncode, served.stdout, served.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert served.returncode == 2 and ("does not exist" in served.stderr or "algo.lr must be" in served.stderr)


def test_an_environment_the_server_was_not_started_in_runs_a_fresh_interpreter(monkeypatch):
    """POPULATION_COMPILE is read when a run starts: the server's command takes it; anything else is settled as
    Python starts, so such a command is not forked from the server; nor any when TESTS_FORK_SERVER=0."""
    compiled = said(run_python([sys.executable, PROBE], env={**os.environ, "POPULATION_COMPILE": "1"}, timeout=60))
    assert compiled["compile"] == "1" and compiled["torch_already_imported"]
    other = run_python([sys.executable, PROBE], env={**os.environ, "OPENBLAS_NUM_THREADS": "2"}, timeout=60)
    assert not said(other)["torch_already_imported"]
    monkeypatch.setenv("TESTS_FORK_SERVER", "0")
    assert not said(run_python([sys.executable, PROBE], timeout=60))["torch_already_imported"]


def test_a_command_past_its_timeout_is_killed_as_subprocess_run_kills_it():
    with pytest.raises(subprocess.TimeoutExpired) as expired:
        run_python([sys.executable, PROBE, "sleep"], timeout=3)
    assert expired.value.stderr == b"to stderr\r\nline\n"  # as subprocess.run's: the bytes
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(json.loads(expired.value.stdout.splitlines()[0])["pid"], 0)
    assert run_python([sys.executable, PROBE, "5"], timeout=60).returncode == 5  # and the server serves on


def test_what_the_server_preloads_starts_no_thread_and_prints_nothing():
    """A fork copies only the thread that forks: a preloaded module's thread would be missing in every command; and
    what an import prints or warns the server printed once, where a fresh command would print it each time."""
    imports = "; ".join(f"import {name}" for name in PRELOADED)
    counted = subprocess.run([sys.executable, "-c", f"{imports}; import os; print(len(os.listdir('/proc/self/task')))"],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (counted.stdout, counted.stderr) == ("1\n", "")
