"""The commands the tests run - `python run.py ...`, `python -m benchmarks.<tool> ...` - each in a process forked
from a server that has already imported torch (with torch._dynamo, which its optimizers load), Hydra, MuJoCo,
Gymnasium and the suite's engine, instead of a fresh interpreter importing them again: about 2.5 of the 2-5 s
each command takes here, over a hundred commands a suite.

The command itself runs as Python runs it: its script or module as __main__, with its argv, sys.path[0], working
directory, stdin (empty), stdout and stderr, exit status, uncaught-exception traceback and atexit handlers, in a
process of its own (its pid, its lock files, a signal or os._exit ends it alone). What a fresh interpreter settles
as it starts is the server's: its environment, the float kernels benchmarks/numerics.py pins on import, the modules
already imported. So a command whose environment differs from the server's in anything but READ_WHEN_A_RUN_STARTS
runs as a fresh interpreter (subprocess.run), as does every `python -c`, every command that is not Python, and
every command when TESTS_FORK_SERVER=0.

One server per test process (each pytest-xdist worker has its own), started at its first command, gone with it.
"""

from __future__ import annotations

import atexit
import io
import json
import locale
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# environment variables read when a run starts, not when Python or torch starts: a command may differ in them (pytest
# sets PYTEST_CURRENT_TEST to each test's name; the suite reads POPULATION_COMPILE when it builds a population)
READ_WHEN_A_RUN_STARTS = frozenset({"POPULATION_COMPILE", "PYTEST_CURRENT_TEST"})
# what the server imports before it forks: what `python run.py` imports, and what it imports lazily on the way
# (its optimizers' torch._dynamo, MuJoCo for the task check); `benchmarks` first, as run.py imports it (it pins the
# kernels before numpy and torch load). Nothing here starts a thread (tested): a fork copies only the calling thread.
PRELOADED = ("benchmarks", "torch", "torch._dynamo", "hydra", "omegaconf", "mujoco", "gymnasium",
             "gymnasium.envs.mujoco", "benchmarks.engine.validate", "benchmarks.engine.trainer",
             "benchmarks.engine.batch_trainer", "benchmarks.engine.hydra_callbacks")


def run_python(command: list[str], *, cwd=None, env: dict | None = None, timeout: float | None = None,
               capture_output: bool = True, text: bool = True) -> subprocess.CompletedProcess:
    """subprocess.run(command, cwd=, env=, timeout=, capture_output=True, text=True), through the server when it can
    run the command as a fresh interpreter would."""
    environment = dict(os.environ if env is None else env)
    served = os.environ.get("TESTS_FORK_SERVER") != "0" and capture_output and text
    if served and _a_command_of_this_tree(command, cwd) \
            and _differences(environment, os.environ) <= READ_WHEN_A_RUN_STARTS:
        server = _the_server()
        changes = {name: environment.get(name) for name in _differences(environment, server.environment)}
        return server.run(command, cwd, changes, timeout)
    return subprocess.run(command, cwd=cwd, env=env, timeout=timeout, capture_output=capture_output, text=text)


def _differences(one: dict, other) -> set[str]:
    return {name for name in one.keys() | other.keys() if one.get(name) != other.get(name)}


def _a_command_of_this_tree(command: list[str], cwd) -> bool:
    """`python -m <module> ...`, or `python <script>.py ...` with the script in this repository (the server's modules
    are this tree's)."""
    if len(command) < 2 or command[0] != sys.executable:
        return False
    if command[1] == "-m":
        return len(command) >= 3
    script = Path(cwd if cwd is not None else os.getcwd()) / command[1]
    return script.suffix == ".py" and script.resolve().is_relative_to(ROOT)


class _Server:
    def __init__(self):
        self.directory = tempfile.mkdtemp(prefix="tests-commands-")
        self.address = os.path.join(self.directory, "socket")
        self.environment = dict(os.environ)
        # its stdin is a pipe from this process: when this process ends, however it ends, the server sees EOF
        self.process = subprocess.Popen([sys.executable, __file__, self.address], cwd=ROOT, stdin=subprocess.PIPE,
                                        stdout=subprocess.DEVNULL)
        while not os.path.exists(self.address):  # it binds after its imports
            if self.process.poll() is not None:
                raise RuntimeError(f"the commands' server exited with {self.process.returncode} before serving")
            select.select([], [], [], 0.05)

    def run(self, command, cwd, changes, timeout) -> subprocess.CompletedProcess:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection, \
                open(os.devnull, "rb") as stdin, tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
            connection.connect(self.address)
            request = json.dumps({"command": [str(part) for part in command], "changes": changes,
                                  "cwd": os.path.abspath(cwd if cwd is not None else os.getcwd())}).encode()
            socket.send_fds(connection, [request], [stdin.fileno(), stdout.fileno(), stderr.fileno()])
            pid = int(_line(connection))
            connection.settimeout(timeout)
            try:
                returncode = int(_line(connection))
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                connection.settimeout(None)
                _line(connection)  # its end
                raise subprocess.TimeoutExpired(command, timeout, _bytes(stdout), _bytes(stderr)) from None
            return subprocess.CompletedProcess(command, returncode, _text(stdout), _text(stderr))

    def close(self):
        self.process.kill()
        self.process.wait()
        for name in os.listdir(self.directory):
            os.unlink(os.path.join(self.directory, name))
        os.rmdir(self.directory)


def _line(connection: socket.socket) -> str:
    """One line of the handler's, read byte by byte (nothing after it is lost to a buffer)."""
    line = b""
    while not line.endswith(b"\n"):
        byte = connection.recv(1)
        if not byte:
            raise RuntimeError("the commands' server closed the connection mid-command")
        line += byte
    return line.decode()


def _bytes(output) -> bytes:
    output.seek(0)
    return output.read()


def _text(output) -> str:
    """As subprocess.run(text=True) decodes: the locale's encoding, universal newlines (its TimeoutExpired carries
    the bytes)."""
    return io.TextIOWrapper(io.BytesIO(_bytes(output)), encoding=locale.getpreferredencoding(False)).read()


_server: _Server | None = None


def _the_server() -> _Server:
    """The server, started again when it has died or when this process's environment has changed where a command
    could tell (a test that set a variable for good, such as the sweep id Hydra's callback exports)."""
    global _server
    if _server is not None and (_server.process.poll() is not None
                                or _differences(dict(os.environ), _server.environment) - READ_WHEN_A_RUN_STARTS):
        _server.close()
        _server = None
    if _server is None:
        _server = _Server()
    return _server


@atexit.register
def _close_the_server() -> None:
    if _server is not None:
        _server.close()


def serve(address: str) -> None:
    """Import PRELOADED, then for each connection fork a handler that forks the command's process, sends its pid,
    waits for it and sends its exit status (a signal's negative number, as subprocess gives it)."""
    import importlib

    sys.path[0] = str(ROOT)  # as for `python run.py` in the repository (this file's directory was put there)
    for name in PRELOADED:
        importlib.import_module(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address + ".binding")
    listener.listen(16)
    os.rename(address + ".binding", address)  # the client waits for this name
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the handlers are reaped as they end
    while True:
        readable, _, _ = select.select([listener, sys.stdin], [], [])
        if sys.stdin in readable:  # EOF: the test process is gone
            os._exit(0)
        connection, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _handle(connection)
        connection.close()


def _handle(connection: socket.socket) -> None:
    message, descriptors, _, _ = socket.recv_fds(connection, 1 << 20, 3)
    request = json.loads(message)
    pid = os.fork()
    if pid == 0:
        connection.close()
        for target, descriptor in enumerate(descriptors):
            os.dup2(descriptor, target)
            os.close(descriptor)
        _run_as_main(request["command"][1:], request["cwd"], request["changes"])
    for descriptor in descriptors:
        os.close(descriptor)
    connection.sendall(f"{pid}\n".encode())
    _, status = os.waitpid(pid, 0)
    connection.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
    os._exit(0)


def _run_as_main(arguments: list[str], cwd: str, changes: dict) -> None:
    """The rest of `python <arguments>` after start-up. It returns only by an exception - SystemExit or the
    command's own - which unwinds to this file's top level, where the interpreter ends the process as it ends any
    script: the traceback printed, the exit status, atexit handlers, buffers flushed."""
    import builtins
    import importlib.machinery
    import runpy
    import types

    os.chdir(cwd)
    for name, value in changes.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    if arguments[0] == "-m":
        sys.argv = [arguments[1], *arguments[2:]]  # -m's own entry point puts the module's path first
        sys.path[0] = os.getcwd()
        runpy._run_module_as_main(arguments[1])
    else:  # as Python runs a script: __main__ replaced, argv as given, __file__ absolute
        script = os.path.abspath(arguments[0])
        sys.argv = list(arguments)
        sys.path[0] = os.path.dirname(os.path.realpath(script))
        main = types.ModuleType("__main__")
        main.__dict__.update(__file__=script, __builtins__=builtins, __cached__=None,
                             __loader__=importlib.machinery.SourceFileLoader("__main__", script))
        sys.modules["__main__"] = main
        with open(script, "rb") as source:
            code = compile(source.read(), script, "exec")
        exec(code, main.__dict__)
    raise SystemExit(0)


if __name__ == "__main__":
    serve(sys.argv[1])
