"""A preloaded parent that forks the tests' pp1q daemons instead of exec'ing each one.

Why: a toy daemon spends ~2.6 s of CPU before it listens, nearly all of it importing
torch and numba and loading numba's kernels; the default suite starts ~160 daemons, and
their start-ups were 40% of its CPU (465 of ~1,140 s on the 2-core reference machine).
The zygote imports those modules and runs both daemons' warm-up once (``_preload``) and
forks a child per daemon (~0.1 s to listen); from there the child runs
``python -m pp1q.cli ARGS`` exactly as an exec'd interpreter would:
same arguments, environment, working directory, stdout pipe and stderr file, and the
exit status comes back as Popen's ``returncode`` (a signal as its negative number).

What stays exec'd, so the real start-up stays tested (the demo and README tests, the
rank groups a verifier spawns, planted daemons): anything but
``[sys.executable, "-m", "pp1q.cli", ...]`` with the options DaemonProcess passes, and
any command whose environment differs from the zygote's in a variable read at
interpreter or library start (``_AT_START``): those would not take effect in a forked
child. ``PP1Q_TEST_ZYGOTE=0`` turns the zygote off (every daemon exec'd, as before).

The protocol on the zygote's Unix socket, one connection per child: the test side sends
one JSON request (module, argv, cwd, env) with two descriptors (the stdout pipe's write
end and the stderr file); the zygote answers the child's pid as one line, then, when
the child exits, its Popen-style return code as a second line, and closes the
connection.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import types

# read at interpreter or library start, or (PP1Q_VALIDATE, PP1Q_DECIDE) at the backend
# choice the zygote makes while it preloads: a child would not see another value
_AT_START = ("MALLOC_", "OMP_", "OPENBLAS_", "MKL_", "NUMBA_", "PYTHON", "LD_", "TORCH_",
             "CUDA_", "KMP_", "GOMP_", "PP1Q_VALIDATE", "PP1Q_DECIDE")
PRELOAD = ("torch", "uvloop", "pp1q.cli", "pp1q.cli.worker", "pp1q.cli.verifier",
           "pp1q.worker.daemon", "pp1q.verifier.daemon", "pp1q.models.toy_engine",
           "pp1q.verifier.kernel_rounds")
REAP_EVERY_S = 0.01  # how soon an exit is reported (a test's wait() sees it this late)
REQUEST_MAX_BYTES = 1 << 20  # one request: an argv and an environment
# the checkout these tests belong to: its pp1q is the one under test
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _preload() -> None:
    """The imports, and both daemons' warm-up (the backend choices and numba's kernels)."""
    for name in PRELOAD:
        __import__(name)
    from pp1q.core.q_backend import warm_up
    from pp1q.verifier.kernel_rounds import warm_up_decisions

    warm_up()
    warm_up_decisions()


def _serve(path: str) -> dict | None:
    """Serve forks until stdin closes (the test process left); in a forked child, return
    its request (the caller runs the daemon)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", sys.modules["pp1q"].__file__, flush=True)  # which pp1q it preloaded
    children: dict[int, socket.socket] = {}
    while True:
        readable, _, _ = select.select([listener, sys.stdin], [], [], REAP_EVERY_S)
        if sys.stdin in readable and not sys.stdin.buffer.read1(1):
            for pid in children:
                _kill(pid)
            return None
        if listener in readable:
            conn, _ = listener.accept()
            request, fds = _receive(conn)
            pid = os.fork()
            if pid == 0:
                listener.close()
                for other in children.values():
                    other.close()
                conn.close()
                _become(request, fds)
                return request
            for fd in fds:
                os.close(fd)
            conn.sendall(f"{pid}\n".encode())
            children[pid] = conn
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is not None:
                code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) \
                    else os.WEXITSTATUS(status)
                with contextlib.suppress(OSError):
                    conn.sendall(f"{code}\n".encode())
                conn.close()


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    """The request runs to the end of the sender's half of the stream; the descriptors
    come with its first bytes."""
    data, fds, _, _ = socket.recv_fds(conn, REQUEST_MAX_BYTES, 2)
    chunks = [data]
    while data and sum(map(len, chunks)) < REQUEST_MAX_BYTES:
        data = conn.recv(REQUEST_MAX_BYTES)
        chunks.append(data)
    return json.loads(b"".join(chunks)), fds


def _become(request: dict, fds: list[int]) -> None:
    """In the child: the descriptors, directory, environment and argv an exec would give."""
    stdout_fd, stderr_fd = fds
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(stdout_fd, 1)
    os.dup2(stderr_fd, 2)
    for fd in (devnull, stdout_fd, stderr_fd):
        os.close(fd)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own stdin
    if request["cwd"]:
        os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])


def _run_daemon(request: dict) -> None:
    import runpy

    sys.path[0] = os.getcwd()  # what ``python -m`` puts first
    sys.argv = [request["module"], *request["argv"]]
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


def main() -> None:
    # first on the path, as ``python -m`` from the checkout's root puts it: started as a
    # script, the zygote had its own folder there and preloaded the installed pp1q (an
    # editable install of another worktree), which every forked daemon then ran
    sys.path[0] = CHECKOUT
    _preload()
    request = _serve(sys.argv[1])
    if request is not None:
        _run_daemon(request)


# ---- the test side -------------------------------------------------------------------


class ZygoteChild:
    """The Popen methods DaemonProcess and the tests use, for a child of the zygote."""

    def __init__(self, zygote_path: str, args: list[str], stderr, env: dict[str, str],
                 cwd: str | None) -> None:
        """``args``: ``[sys.executable, "-m", module, *argv]``."""
        self.args, self.returncode = args, None
        read_end, write_end = os.pipe()
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._conn.connect(zygote_path)
            request = {"module": args[2], "argv": args[3:], "cwd": cwd, "env": env}
            socket.send_fds(self._conn, [json.dumps(request).encode()],
                            [write_end, stderr.fileno()])
            self._conn.shutdown(socket.SHUT_WR)
        finally:
            os.close(write_end)
        self._received = b""
        self.pid = int(self._line())
        self.stdout = open(read_end)  # noqa: SIM115 - lives as long as the child

    def _line(self) -> bytes:
        """The zygote's next line (unbuffered beyond it: select sees what is still due)."""
        while b"\n" not in self._received:
            data = self._conn.recv(64)
            if not data:
                raise RuntimeError("the test zygote closed the connection")
            self._received += data
        line, self._received = self._received.split(b"\n", 1)
        return line

    def poll(self) -> int | None:
        return self.wait(0) if self._exited(0) else None

    def _exited(self, timeout: float | None) -> bool:
        if self.returncode is not None or b"\n" in self._received:
            return True
        return bool(select.select([self._conn], [], [], timeout)[0])

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        if self.returncode is None:
            self.returncode = int(self._line())
            self._conn.close()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """A Popen that forks pp1q daemons from the zygote (started with ``env``, the daemons'
    environment, on the first such daemon) and execs everything else."""

    def __init__(self, folder: str, env: dict[str, str]) -> None:
        self.path, self.env = os.path.join(folder, "zygote.sock"), env
        self.proc: subprocess.Popen | None = None

    def started(self) -> bool:
        if self.proc is None:
            self.proc = subprocess.Popen([sys.executable, __file__, self.path], env=self.env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         text=True)
            line = self.proc.stdout.readline().split(maxsplit=1)
            if line[:1] != ["ready"] or not line[1].strip().startswith(CHECKOUT + os.sep):
                self.proc.kill()
                raise RuntimeError(f"the test zygote did not start, or preloaded another "
                                   f"checkout's pp1q than {CHECKOUT}'s ({line!r})")
        return self.proc.poll() is None

    def _forkable(self, cmd, kwargs: dict) -> bool:
        env = kwargs.get("env") or os.environ
        return (list(cmd[:3]) == [sys.executable, "-m", "pp1q.cli"]
                and set(kwargs) <= {"stdout", "stderr", "text", "env", "cwd"}
                and kwargs.get("stdout") == subprocess.PIPE and kwargs.get("text")
                and hasattr(kwargs.get("stderr"), "fileno")
                and all(env.get(k) == self.env.get(k) for k in {*env, *self.env}
                        if k.startswith(_AT_START)))

    def popen(self, cmd, **kwargs):
        if self._forkable(cmd, kwargs) and self.started():
            return ZygoteChild(self.path, list(cmd), kwargs["stderr"],
                               dict(kwargs.get("env") or os.environ), kwargs.get("cwd"))
        return subprocess.Popen(cmd, **kwargs)

    def subprocess_module(self) -> types.SimpleNamespace:
        """``subprocess`` with Popen routed through the zygote (for the launcher)."""
        return types.SimpleNamespace(**{**vars(subprocess), "Popen": self.popen})

    def close(self) -> None:
        if self.proc is None:
            return
        self.proc.stdin.close()  # the zygote kills what it still runs and exits
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    main()
