"""The commands the tests run - `python run.py ...`, `python -m benchmarks.<tool> ...` - each in a process forked
from a server that has already imported torch (with torch._dynamo, which its optimizers load), Hydra, MuJoCo,
Gymnasium and the suite's engine, instead of a fresh interpreter importing them again: about 2.5 of the 2-5 s
each such command takes here.

The command runs as Python runs it: its script or module as a fresh __main__, with its argv, sys.path[0],
__file__, working directory, stdin (empty), stdout and stderr, exit status and atexit handlers, in a process of
its own (its pid, its lock files; a signal or os._exit ends it alone; a timeout kills it, as subprocess.run
kills its child). What differs from a fresh interpreter: what Python settles as it starts is the server's - the
environment, the float kernels benchmarks/numerics.py pins on import, the string-hash seed (one per server, so
two commands of a test share it), the modules already imported (anything they print or warn on import was
printed once, by the server, which tests/test_commands.py checks is nothing); an uncaught exception's traceback
has the server's frames above the command's; the result comes when the command exits, not when the last process
holding its output closes it. So the tests that are about start-up run fresh interpreters themselves (the
numerics mode, the import order, kill -9 and resume, signals), and `run_python` runs a fresh one
(subprocess.run) for a command given another environment than the tests' (but READ_WHEN_A_RUN_STARTS), for a
script or module outside this repository, for `python -c`, and for every command under TESTS_FORK_SERVER=0.

One server per test process (each pytest-xdist worker has its own), started at its first command, started again
when the tests' environment changes, gone when the test process is.
"""

from __future__ import annotations

import atexit
import importlib.util
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
SERVER_START_TIMEOUT_S = 300


def run_python(command: list[str], *, cwd=None, env: dict | None = None, timeout: float | None = None,
               capture_output: bool = True, text: bool = True) -> subprocess.CompletedProcess:
    """subprocess.run(command, cwd=, env=, timeout=, capture_output=True, text=True), through the server when it can
    run the command as a fresh interpreter would."""
    environment = dict(os.environ if env is None else env)
    served = os.environ.get("TESTS_FORK_SERVER") != "0" and capture_output and text
    if served and _unavailable is None and _a_command_of_this_tree(command, cwd) \
            and _differences(environment, os.environ) <= READ_WHEN_A_RUN_STARTS:
        server = _the_server()
        if server is not None:
            changes = {name: environment.get(name) for name in _differences(environment, server.environment)}
            return server.run(command, cwd, changes, timeout)
    return subprocess.run(command, cwd=cwd, env=env, timeout=timeout, capture_output=capture_output, text=text)


def _differences(one: dict, other) -> set[str]:
    return {name for name in one.keys() | other.keys() if one.get(name) != other.get(name)}


def _a_command_of_this_tree(command: list[str], cwd) -> bool:
    """`python <script>.py ...` or `python -m <module> ...` whose script or module is in this repository (the
    server's modules are this tree's), found as the command would find it: a module first in its working
    directory, then on the path."""
    if len(command) < 2 or command[0] != sys.executable or command[1] == "-m" and len(command) < 3:
        return False
    directory = Path(cwd if cwd is not None else os.getcwd())
    if command[1] != "-m":
        found = directory / command[1] if command[1].endswith(".py") else None
    else:
        top = command[2].split(".")[0]
        found = next((path for path in (directory / f"{top}.py", directory / top) if path.exists()), None)
        if found is None:
            spec = importlib.util.find_spec(top)
            found = Path(spec.origin) if spec is not None and spec.origin else None
    return found is not None and found.resolve().is_relative_to(ROOT)


class _Server:
    def __init__(self):
        self.environment = dict(os.environ)
        # requests go over a socket pair, one message each; the server ends when this end closes (this process ended)
        self.requests, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.process = subprocess.Popen([sys.executable, __file__, str(theirs.fileno())], cwd=ROOT,
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, pass_fds=[theirs.fileno()])
        theirs.close()
        self.requests.settimeout(SERVER_START_TIMEOUT_S)
        try:
            ready = self.requests.recv(16)  # after its imports
        except TimeoutError:
            ready = b""
        if ready != b"ready":
            self.close()
            raise RuntimeError(f"the commands' server did not start (exit status {self.process.returncode})")
        self.requests.settimeout(None)

    def run(self, command, cwd, changes, timeout) -> subprocess.CompletedProcess:
        """The command's process is the server's grandchild: its parent (a handler) sends its pid, then its exit
        status, and kills it when this side of `channel` is shut (a timeout, an interrupt, this process's end)."""
        channel, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with channel, open(os.devnull, "rb") as stdin, tempfile.TemporaryFile() as stdout, \
                tempfile.TemporaryFile() as stderr:
            request = json.dumps({"command": [str(part) for part in command], "changes": changes,
                                  "cwd": os.path.abspath(cwd if cwd is not None else os.getcwd())}).encode()
            with theirs:
                socket.send_fds(self.requests, [request], [stdin.fileno(), stdout.fileno(), stderr.fileno(),
                                                           theirs.fileno()])
            int(_line(channel))  # its pid: it runs
            channel.settimeout(timeout)
            try:
                returncode = int(_line(channel))
            except BaseException as stopped:
                channel.shutdown(socket.SHUT_WR)  # its handler kills it
                channel.settimeout(None)
                _line(channel)  # and it has ended
                if isinstance(stopped, TimeoutError):
                    raise subprocess.TimeoutExpired(command, timeout, _bytes(stdout), _bytes(stderr)) from None
                raise
            return subprocess.CompletedProcess(command, returncode, _text(stdout), _text(stderr))

    def close(self):
        self.requests.close()
        self.process.kill()
        self.process.wait()


def _line(channel: socket.socket) -> str:
    """One line of the handler's, read byte by byte (nothing after it is lost to a buffer)."""
    line = b""
    while not line.endswith(b"\n"):
        byte = channel.recv(1)
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
_unavailable: str | None = None  # why no server can run here: every command then starts a fresh interpreter


def _the_server() -> _Server | None:
    """The server, started again when it has died or when this process's environment has changed where a command
    could tell (a test that set a variable for good, such as the sweep id Hydra's callback exports); None where it
    cannot run (it needs Linux: pidfd_open, SOCK_SEQPACKET), said once."""
    global _server, _unavailable
    if _server is not None and (_server.process.poll() is not None
                                or _differences(dict(os.environ), _server.environment) - READ_WHEN_A_RUN_STARTS):
        _server.close()
        _server = None
    if _server is None:
        if not hasattr(os, "pidfd_open") or not hasattr(socket, "SOCK_SEQPACKET"):
            _unavailable = "this system has no os.pidfd_open or SOCK_SEQPACKET (Linux has both)"
            print(f"tests/commands.py: every command starts a fresh interpreter: {_unavailable}", file=sys.stderr)
            return None
        _server = _Server()
    return _server


@atexit.register
def _close_the_server() -> None:
    if _server is not None:
        _server.close()


def serve(requests: socket.socket) -> None:
    """Import PRELOADED, say ready, then for each request fork a handler (it forks the command's process)."""
    import importlib

    sys.path[0] = str(ROOT)  # as for `python run.py` in the repository (this file's directory was put there)
    for name in PRELOADED:
        importlib.import_module(name)
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the handlers are reaped as they end
    requests.send(b"ready")
    while True:
        message, descriptors, _, _ = socket.recv_fds(requests, 1 << 20, 4)
        if not message:  # the test process is gone
            os._exit(0)
        if os.fork() == 0:
            requests.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _handle(json.loads(message), descriptors[:3], socket.socket(fileno=descriptors[3]))
        for descriptor in descriptors:
            os.close(descriptor)


def _handle(request: dict, stdio: list[int], channel: socket.socket) -> None:
    """Fork the command's process, send its pid, then its exit status (a signal's negative number, as subprocess
    gives it); kill it if the test's side of the channel shuts first."""
    pid = os.fork()
    if pid == 0:
        channel.close()
        for target, descriptor in enumerate(stdio):
            os.dup2(descriptor, target)
            os.close(descriptor)
        _run_as_main(request["command"][1:], request["cwd"], request["changes"])
    for descriptor in stdio:
        os.close(descriptor)
    channel.sendall(f"{pid}\n".encode())
    ended = os.pidfd_open(pid)
    readable, _, _ = select.select([ended, channel], [], [])
    if ended not in readable:  # the test stopped waiting: it is killed, as subprocess.run kills its child
        os.kill(pid, signal.SIGKILL)  # not yet reaped, so still this pid
    _, status = os.waitpid(pid, 0)
    try:
        channel.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
    except OSError:  # the test process is gone
        pass
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
    main = types.ModuleType("__main__")  # a fresh namespace: nothing of this file's
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    if arguments[0] == "-m":
        sys.argv = [arguments[1], *arguments[2:]]  # -m's own entry point puts the module's path first
        sys.path[0] = os.getcwd()
        runpy._run_module_as_main(arguments[1])  # what `python -m` calls
    else:  # as Python runs a script: argv as given, __file__ absolute
        script = os.path.abspath(arguments[0])
        sys.argv = list(arguments)
        sys.path[0] = os.path.dirname(os.path.realpath(script))
        main.__dict__.update(__file__=script, __cached__=None,
                             __loader__=importlib.machinery.SourceFileLoader("__main__", script))
        with open(script, "rb") as source:
            code = compile(source.read(), script, "exec")
        exec(code, main.__dict__)
    raise SystemExit(0)


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
