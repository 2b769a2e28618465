"""Notebook kernels forked from one process that has already imported PyTorch and Keras (``make book``).

Every executed page of the book starts a fresh IPython kernel, and every kernel spends its first eight seconds or
so importing PyTorch and Keras/TensorFlow: well over a minute of the English build's CPU time, the same imports each
time. Here one process, the *zygote*, imports them once; each kernel is a fork of it, as fresh as a new process in
everything a page can see (its own memory, working directory, environment variables and standard streams, nothing
run yet), except that the modules in :data:`PRELOAD` are already in ``sys.modules``.

How a kernel starts: MyST-NB asks jupyter_client for the notebooks' kernel, ``python3``. During the build a
kernel spec of that name comes first on ``JUPYTER_PATH`` (so the notebooks, and the executed copies readers
download, keep their kernel name). It runs ``warm_kernels.py connect``, which passes the zygote its connection file,
working directory, environment and standard streams over a Unix socket, then stays as the process jupyter_client
watches: it forwards signals (an interrupt, a termination) to the kernel's process group and exits when the kernel
does. When it is killed, the kernel sees the socket close and ends too. When there is no zygote (it failed to start,
or died), ``connect`` becomes an ordinary kernel (``ipykernel_launcher``): slower, never different.

What a page can tell: ``sys.modules`` already holds the preloaded modules, and ``companion.seed.seed_everything``
seeds the frameworks it finds there. A page that seeded, then imported Keras and drew random numbers from it, would
draw other numbers than in a fresh kernel; the book's pages import what they draw from before they seed
(tests/test_warm_kernels.py runs the page that once did not, ``book/masks.md``, both ways).

The zygote binds its socket before it imports anything, so a kernel asked for during the imports waits for them;
it exits when the build closes its standard input. Forking is safe here because the zygote runs no framework
operation: TensorFlow and PyTorch start their thread pools at the first operation, in the kernel.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

KERNEL_NAME = "python3"  # the kernel spec the book's notebooks name, replaced for the build
PRELOAD = ("numpy", "torch", "keras", "ipykernel.kernelapp", "companion.torch", "companion.keras")
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def _ordinary_kernel(argv: list[str]) -> None:
    """Become the kernel jupyter_client would have started (used when there is no zygote to fork from)."""
    os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", *argv])


def connect(socket_path: str, argv: list[str]) -> int:
    """The kernel process jupyter_client sees: ask the zygote for a kernel, relay signals, end when it ends."""
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.connect(socket_path)
        socket.send_fds(client, [b"k"], [0, 1, 2])
        request = {"cwd": os.getcwd(), "env": dict(os.environ), "argv": argv}
        client.sendall(json.dumps(request).encode() + b"\n")
        reply = client.makefile("rb").readline()
    except OSError:
        reply = b""
    if not reply:                                              # no zygote, or it could not fork
        client.close()
        _ordinary_kernel(argv)
    kernel = json.loads(reply)["pid"]

    def forward(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(kernel, signum)                          # the kernel leads its own process group

    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, forward)
    parent = os.getppid()
    while True:                                                # nothing is sent: this waits for the kernel to exit
        ready, _, _ = select.select([client], [], [], 1.0)
        if ready and not client.recv(4096):
            return 0
        if os.getppid() != parent:                             # the build went away: so does its kernel, as
            forward(signal.SIGKILL, None)                      # ipykernel's own parent poller would see to
            return 1


def _run_kernel(conn: socket.socket, request: dict, fds: list[int]) -> None:
    """In the forked child: become a fresh kernel with the client's streams, directory and environment."""
    os.setsid()                                                # a process group of its own, as jupyter_client gives
    for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for target, fd in zip((0, 1, 2), fds, strict=True):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    import ipykernel_launcher

    sys.argv = [ipykernel_launcher.__file__, *request["argv"]]
    conn.sendall(json.dumps({"pid": os.getpid()}).encode() + b"\n")

    def end_with_client() -> None:
        conn.recv(1)                                           # returns when the client has gone (killed or exited)
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=end_with_client, daemon=True).start()
    status = 0
    try:
        from ipykernel import kernelapp

        # parent_handle=1: no parent poller in the kernel (its parent is the zygote; `connect` watches the build)
        kernelapp.launch_new_instance(argv=[*request["argv"], "--IPKernelApp.parent_handle=1"])
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
        status = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def serve(socket_path: str, preload: tuple[str, ...] = PRELOAD) -> int:
    """The zygote: listen, import ``preload``, then fork one kernel per request until standard input closes."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)                                        # requests made during the imports wait in the backlog
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        sys.path.pop(0)                                        # a kernel's path, not this script's
    # What ipykernel sets before a page runs: Keras imports matplotlib, which reads its backend at import (without
    # it, figures would not be shown in the kernels).
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    for name in preload:
        importlib.import_module(name)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)              # forked kernels are reaped by the system
    while True:
        ready, _, _ = select.select([listener, sys.stdin], [], [])
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1):
            return 0
        if listener not in ready:
            continue
        conn, _ = listener.accept()
        try:
            _, fds, _, _ = socket.recv_fds(conn, 1, 3)
            request = json.loads(conn.makefile("rb").readline())
        except (OSError, ValueError):
            conn.close()
            continue
        if len(fds) != 3:                                      # the client falls back to an ordinary kernel
            conn.close()
            for fd in fds:
                os.close(fd)
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:
            listener.close()
            _run_kernel(conn, request, fds)
        conn.close()
        for fd in fds:
            os.close(fd)


def kernel_spec(home: Path, socket_path: str) -> Path:
    """Write the kernel spec of :data:`KERNEL_NAME` under ``home/kernels`` (a directory for ``JUPYTER_PATH``)."""
    spec = home / "kernels" / KERNEL_NAME
    spec.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, str(Path(__file__).resolve()), "connect", socket_path, "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "Python 3 (forked, preloaded)",
                                                  "language": "python", "interrupt_mode": "signal"}))
    return spec


@contextlib.contextmanager
def warm_kernels(preload: tuple[str, ...] = PRELOAD) -> Iterator[Path]:
    """Start a zygote for the duration of a build; yields the directory of its socket and kernel spec.

    Puts that directory first on ``JUPYTER_PATH``, so that jupyter_client finds this ``python3`` kernel spec before
    any other (the build's processes inherit it), and restores the variable afterwards. Settings such as
    :func:`edition.kernel_threads` must be in the environment before: the zygote's imports read them.
    """
    # mode 700: no other user can reach the socket; short: a Unix socket's path has about 100 bytes
    home = Path(tempfile.mkdtemp(prefix="course-kernels-"))
    socket_path = str(home / "zygote")
    zygote = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "serve", socket_path, *preload],
                              stdin=subprocess.PIPE)
    kernel_spec(home, socket_path)
    deadline = time.monotonic() + 10.0
    while not os.path.exists(socket_path) and zygote.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)                                       # bound before its imports: a fraction of a second
    saved = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(home), saved]))
    try:
        yield home
    finally:
        if saved is None:
            os.environ.pop("JUPYTER_PATH", None)
        else:
            os.environ["JUPYTER_PATH"] = saved
        zygote.stdin.close()
        try:
            zygote.wait(timeout=30)
        except subprocess.TimeoutExpired:
            zygote.kill()
            zygote.wait()
        shutil.rmtree(home, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) >= 2 and args[0] == "serve":
        return serve(args[1], tuple(args[2:]))
    if len(args) >= 2 and args[0] == "connect":
        return connect(args[1], args[2:])
    print("usage: warm_kernels.py serve SOCKET [MODULE ...] | connect SOCKET -f CONNECTION_FILE", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
