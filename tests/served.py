"""The test's side of tests/launch_server.py: `launch` as a process of its own, forked from a warm
server (one per test process, started on first use) instead of a new interpreter.

`ServedLaunch` is what the tests use of a `subprocess.Popen` (pid, poll, wait, signals);
`served_run` what they use of `subprocess.run`. A launch runs as a real subprocess instead where a
fork would not be the same: an environment read when Python or torch start (`_READ_AT_START`:
PYTHON*, PYTORCH*, TORCH*, LD_*, the thread libraries' other than OMP_NUM_THREADS, the locale,
LOGLEVEL) that differs from the server's; a stream asked for as a pipe; no server (not Linux, or
it failed to start: said once); LAUNCHER_TESTS_SUBPROCESS=1 (every launch a new interpreter, to
tell a test's failure from this harness's).
"""

from __future__ import annotations

import atexit
import errno
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import warnings
from contextlib import suppress
from pathlib import Path
from typing import IO, Any

from tests.launch_server import COMMAND_LINE_ROOM

REPO = Path(__file__).resolve().parent.parent
LAUNCH = [sys.executable, "-m", "launcher.cli"]
READY_TIMEOUT_S = 180.0
_READ_AT_START = (
    *("PYTHON", "PYTORCH", "TORCH", "LD_", "MKL", "KMP", "GOMP", "OMP_", "OPENBLAS", "GOTO"),
    *("LANG", "LC_", "LOGLEVEL"),
)
_SERVER: dict[int, _Server | None] = {}  # this process's pid -> its server (none after a fork)
_ENVIRONMENT = dict(os.environ)
"""The servers' environment: this process's before any test changed it (a server started while a
test had set PYTHONPATH, say, would fork every later launch from the wrong start-up)."""
CPU_SECONDS = [0.0]
"""CPU-seconds of this process's ended served launches (the server's children, not this
process's, so RUSAGE_CHILDREN misses them): tests/suite_profile.py adds them."""


class _Server:
    def __init__(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="launch-server-")
        atexit.register(shutil.rmtree, self.directory, ignore_errors=True)  # its socket
        self.path = os.path.join(self.directory, "socket")
        self.env = {k: v for k, v in _ENVIRONMENT.items() if k != "OMP_NUM_THREADS"}
        self.proc = subprocess.Popen(
            # Room for each launch's command line (launch_server._show_command_line).
            [sys.executable, "-m", "tests.launch_server", self.path, "-" * COMMAND_LINE_ROOM],
            cwd=REPO,
            env=self.env,
            stdin=subprocess.PIPE,  # closed when this process ends: the server ends too
            stdout=subprocess.PIPE,
        )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], READY_TIMEOUT_S)
        line = self.proc.stdout.readline() if ready else b""
        if line.strip() != b"ready":
            self.proc.kill()
            raise RuntimeError(f"tests/launch_server.py did not start (exit {self.proc.poll()})")

    def forks_alike(self, env: dict[str, str]) -> bool:
        """Whether a launch with `env` forked from here is what a new interpreter would be."""
        keys = {k for k in {*env, *self.env} if k.startswith(_READ_AT_START)}
        return all(env.get(k) == self.env.get(k) for k in keys - {"OMP_NUM_THREADS"})


def _server() -> _Server | None:
    pid = os.getpid()
    if pid not in _SERVER:
        _SERVER[pid] = None
        if sys.platform.startswith("linux") and os.environ.get("LAUNCHER_TESTS_SUBPROCESS") != "1":
            try:
                _SERVER[pid] = _Server()
            except (OSError, RuntimeError) as exc:
                warnings.warn(f"launches run as new interpreters: {exc}", stacklevel=3)
    return _SERVER[pid]


def _fd(stream: IO[Any] | int | None, default: int) -> int:
    if stream is None:
        return default
    if stream == subprocess.DEVNULL:
        return os.open(os.devnull, os.O_RDWR)  # closed once sent (ServedLaunch)
    return stream if isinstance(stream, int) else stream.fileno()


class ServedLaunch:
    """`launch ARGS` forked by the server: pid, poll, wait, send_signal, terminate, kill."""

    def __init__(
        self,
        server: _Server,
        args: list[str],
        cwd: Path,
        env: dict[str, str],
        stdin: IO[Any] | int | None = None,
        stdout: IO[Any] | int | None = None,
        stderr: IO[Any] | int | None = None,
        own_session: bool = False,
    ) -> None:
        self.args = [*LAUNCH, *args]
        self.returncode: int | None = None
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._start(server, args, cwd, env, (stdin, stdout, stderr), own_session)
        except BaseException:
            self._conn.close()
            raise

    def _start(
        self,
        server: _Server,
        args: list[str],
        cwd: Path,
        env: dict[str, str],
        streams: tuple[IO[Any] | int | None, ...],
        own_session: bool,
    ) -> None:
        stdin, stdout, stderr = streams
        self._conn.connect(server.path)
        fds = [_fd(stdin, 0), _fd(stdout, 1)]
        fds.append(fds[1] if stderr == subprocess.STDOUT else _fd(stderr, 2))
        request = {"args": args, "cwd": str(cwd), "env": env, "own_session": own_session}
        try:
            socket.send_fds(self._conn, [json.dumps(request).encode()], fds)
        finally:
            for fd, stream in zip(fds, (stdin, stdout, stderr), strict=True):
                if stream == subprocess.DEVNULL:
                    os.close(fd)
        reply = self._conn.recv(64)
        if not reply:
            raise OSError(f"the launch server refused `launch {' '.join(args)}` (its stderr)")
        self.pid = int(reply)

    def _reply(self, timeout: float | None) -> int | None:
        self._conn.settimeout(timeout)
        try:
            data = self._conn.recv(64)
        except (TimeoutError, BlockingIOError):
            return None
        if not data:  # the launch may still run (kill still reaches it): no status to report
            raise RuntimeError(f"the launch server died while pid {self.pid} ran: status lost")
        code, _, cpu = data.decode().partition(" ")
        self.returncode = int(code)
        CPU_SECONDS[0] += float(cpu or 0.0)
        self._conn.close()
        return self.returncode

    def poll(self) -> int | None:
        return self.returncode if self.returncode is not None else self._reply(0.0)

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and self._reply(timeout) is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        try:
            running = self.poll() is None
        except RuntimeError:  # the server died: its status is lost, the launch may still run
            running = True
        if running:
            with suppress(ProcessLookupError):  # ended, its status not yet sent
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        import signal

        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        import signal

        self.send_signal(signal.SIGKILL)


def popen(
    args: list[str], cwd: Path, env: dict[str, str], **streams: Any
) -> ServedLaunch | subprocess.Popen[Any]:
    """`launch ARGS` started as `subprocess.Popen([*LAUNCH, *args], ...)` would start it; `env`
    is the whole environment. streams: stdin, stdout, stderr, own_session."""
    if not Path(cwd).is_dir():  # as Popen raises, before anything starts
        raise FileNotFoundError(errno.ENOENT, "no such directory", str(cwd))
    server = _server()
    if server is not None and server.forks_alike(env) and subprocess.PIPE not in streams.values():
        try:
            return ServedLaunch(server, args, cwd, env, **streams)
        except OSError as exc:
            # A request over the socket's size: this launch only gets an interpreter. Else the
            # server is gone: new interpreters from here on.
            if exc.errno != errno.EMSGSIZE:
                _SERVER[os.getpid()] = None
                warnings.warn(
                    f"launches run as new interpreters: the server failed ({exc})", stacklevel=2
                )
    own_session = streams.pop("own_session", False)
    return subprocess.Popen(
        [*LAUNCH, *args], cwd=cwd, env=env, start_new_session=own_session, **streams
    )


def served_run(
    args: list[str], cwd: Path, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """As `subprocess.run([*LAUNCH, *args], capture_output=True, text=True, timeout=...)`."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = popen(args, cwd, env, stdout=out, stderr=err)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            proc.kill()
            proc.wait()
            exc.stdout, exc.stderr = read_output(out), read_output(err)
            raise
        texts = read_output(out), read_output(err)
        return subprocess.CompletedProcess([*LAUNCH, *args], code, *texts)


def read_output(file: IO[bytes]) -> str:
    """A captured stream's text: UTF-8, undecodable bytes replaced, and unlike subprocess's text
    mode no newline translation (a stray \r stays visible to the tests of non-terminal output)."""
    file.seek(0)
    return file.read().decode("utf-8", errors="replace")
