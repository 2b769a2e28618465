"""The student's process server: imports the frameworks once, then forks a fresh student process per notebook.

Started by :mod:`companion.grade.forkserver` inside the same sandbox and under the same limits as a student's
process (:mod:`companion.grade.launcher`), for the notebooks of one folder (one student). It runs none of the
student's code itself: it imports NumPy and the frameworks (the slow part of a student process's start), says
``ready`` and then waits on its control socket (a ``SOCK_SEQPACKET`` socket inherited from the grader) for:

- ``fork`` with three file descriptors (request pipe, reply pipe, output pipe) and a CPU-time limit: it forks a
  child that lowers its CPU limit, writes its output to the given pipe and serves one notebook exactly as a
  freshly started student process does (:class:`.child.Server`); the child starts from the state right after the
  imports, a copy of this process's memory, so nothing one notebook's code did can be seen by the next;
- ``status``: the wait status of the child once it has exited (waits up to the given seconds);
- ``end``: kill every descendant (the child and whatever it started: this process is their subreaper, so a
  process that detaches stays its descendant), wait for them, and answer; only then does the next ``fork`` come;
- ``ping``: answer ``pong`` (the class worker asks after each student whether this process is still sound).

A zygote started ``shared`` (by a class worker, :mod:`companion.grade.classworker`) serves one student after
another. It never runs a student's code either, and every student process is forked from it, so each starts
from the same pristine state; what a student could leave behind in the sandbox is removed by ``reset``, which
the next student's grader sends before its first ``fork``, with that student's notebooks (one file descriptor
holding them one after another, and their names and sizes): kill every descendant and wait for them, empty
``/tmp``, ``/dev/shm`` and ``/sandbox/notebook`` (the only writable places; the read-only binds that the sandbox
started with stay, a virtual environment under ``/tmp`` say) and check that they are empty,
remove every System V IPC object (POSIX message queues are refused by the seccomp filter), then write the
notebooks into ``/sandbox/notebook``. This process is not dumpable, so a student process (same user) can neither
read nor write its memory, and its control socket is closed in every child; a student process can still kill or
stop it, which fails the next request: the grader then ends the whole sandbox, and a fresh one carries on.

The grader never relies on this process for containment: it keeps its own time limits on every answer, and it
ends the whole sandbox (:meth:`companion.grade.launcher.Child.kill`) when this process does not answer in time,
and always before it writes a report.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import sys
import time
import warnings

from .processes import children_of

_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
#: The writable places of the sandbox, emptied between two students by a shared zygote.
WRITABLE = ("/tmp", "/dev/shm", "/sandbox/notebook")
NOTEBOOKS = "/sandbox/notebook"
_IPC_RMID = 0
_MODULES = {"torch": ("torch",), "keras": ("keras",)}


def _prctl(option: int, value: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _kill_descendants() -> None:
    """SIGKILL every child until none is left; orphans of the killed are re-parented here and killed in turn."""
    me = os.getpid()
    for _ in range(1000):
        while True:  # reap what has exited (re-parented orphans included)
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                pid = 0
            if pid == 0:
                break
        children = children_of(me)
        if not children:
            return
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.005)


def _remove(path: str) -> None:
    """Remove a file or a whole folder of this user's, whatever its permissions."""
    if os.path.isdir(path) and not os.path.islink(path):
        try:
            os.chmod(path, 0o700)  # a folder its owner made unreadable
        except OSError:
            pass
        for root, folders, _ in os.walk(path):
            for name in folders:  # made readable before os.walk lists them
                inner = os.path.join(root, name)
                if not os.path.islink(inner):
                    try:
                        os.chmod(inner, 0o700)
                    except OSError:
                        pass
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _remove_ipc_objects() -> None:
    """Remove every System V shared-memory segment, semaphore set and message queue of this IPC namespace."""
    libc = ctypes.CDLL(None, use_errno=True)
    for kind, remove in (("shm", lambda i: libc.shmctl(i, _IPC_RMID, None)),
                         ("sem", lambda i: libc.semctl(i, 0, _IPC_RMID)),
                         ("msg", lambda i: libc.msgctl(i, _IPC_RMID, None))):
        try:
            with open(f"/proc/sysvipc/{kind}", encoding="ascii") as file:
                rows = file.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 1 and fields[1].isdigit():
                remove(int(fields[1]))


def _mounts_below(folders: tuple[str, ...]) -> frozenset[str]:
    """The mount points inside ``folders``: read-only binds the sandbox started with (a virtual environment or the
    course under ``/tmp``, say). Nothing in the sandbox may mount, so they are the same for every student."""
    points = set()
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as file:
            for line in file:
                fields = line.split()
                if len(fields) < 5:
                    continue
                # mountinfo writes a space, tab, newline or backslash in a path as an octal escape
                point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
                if any(point.startswith(folder + "/") for folder in folders):
                    points.add(point)
    except OSError:
        pass
    return frozenset(points)


def _leads_to(path: str, kept: frozenset[str]) -> bool:
    """Whether ``path`` is a folder that bubblewrap made to hold one of the mount points ``kept``."""
    return os.path.isdir(path) and not os.path.islink(path) and any(p.startswith(path + "/") for p in kept)


def _empty(folder: str, kept: frozenset[str]) -> None:
    """Remove everything inside ``folder`` but the mount points ``kept`` and the folders that lead to them, which are
    emptied of everything else in turn."""
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if path in kept:
            continue
        if _leads_to(path, kept):
            try:
                os.chmod(path, 0o755)  # a student may have made it unreadable
            except OSError:
                pass
            _empty(path, kept)
        else:
            _remove(path)


def _files_in(folder: str, kept: frozenset[str]) -> list[str]:
    """What :func:`_empty` would remove from ``folder``."""
    left = []
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if path not in kept:
            left += _files_in(path, kept) if _leads_to(path, kept) else [path]
    return left


def _left_behind(kept: frozenset[str]) -> list[str]:
    """What is still in the writable places or the IPC namespace (empty after a successful reset); ``kept``: the
    mount points found there at the start, which must all still be where they were."""
    left = [path for folder in WRITABLE if os.path.isdir(folder) for path in _files_in(folder, kept)]
    if _mounts_below(WRITABLE) != kept:
        left.append("a read-only bind of the sandbox (moved)")
    for kind in ("shm", "sem", "msg"):
        try:
            with open(f"/proc/sysvipc/{kind}", encoding="ascii") as file:
                left += [f"a System V {kind} object"] * (len(file.read().splitlines()) - 1)
        except OSError:
            pass
    return left


def _valid_name(name: object) -> bool:
    return isinstance(name, str) and 0 < len(name) <= 255 and "/" not in name and "\0" not in name \
        and name not in (".", "..")


class Zygote:
    def __init__(self, control: socket.socket, shared: bool = False) -> None:
        self.control = control
        self.shared = shared
        self.kept = _mounts_below(WRITABLE)  # before any student: what a reset leaves in the writable places
        self.child = 0
        self.status: int | None = None

    def reply(self, message: dict) -> None:
        self.control.send(json.dumps(message).encode("utf-8"))

    def wait_child(self, seconds: float) -> int | None:
        """The child's wait status once it has exited, waiting up to ``seconds``."""
        deadline = time.monotonic() + seconds
        while self.status is None and self.child:
            try:
                pid, status = os.waitpid(self.child, os.WNOHANG)
            except ChildProcessError:
                return None
            if pid == self.child:
                self.status = status
                break
            if time.monotonic() >= deadline:
                break
            time.sleep(0.01)
        return self.status

    def fork(self, request: dict, fds: list[int]) -> None:
        if len(fds) != 3:
            for fd in fds:
                os.close(fd)
            self.reply({"error": "a fork request needs three file descriptors"})
            return
        _kill_descendants()  # nothing of an earlier notebook is left (normally done by `end` already)
        fd_in, fd_out, output = fds
        parent = os.getpid()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # "multi-threaded, fork() may deadlock" (3.12+)
            pid = os.fork()
        if pid == 0:  # the student's process of one notebook
            try:
                _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # it never outlives this process
                _prctl(_PR_SET_DUMPABLE, 1)  # as a process started anew (the zygote itself is not dumpable)
                if os.getppid() != parent:
                    os._exit(1)
                self.control.close()
                os.dup2(output, 1)
                os.dup2(output, 2)
                os.close(output)
                seconds = int(request.get("cpu_seconds", 0))
                _, hard = resource.getrlimit(resource.RLIMIT_CPU)
                if seconds > 0:
                    if hard != resource.RLIM_INFINITY:
                        seconds = min(seconds, max(hard - 5, 1))
                    resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 5 if hard == resource.RLIM_INFINITY
                                                             else min(seconds + 5, hard)))
                from .child import Server

                server = Server(fd_in, fd_out)
                server.serve()
            finally:
                os._exit(0)
        for fd in fds:
            os.close(fd)
        self.child, self.status = pid, None
        self.reply({"forked": True})

    def reset(self, request: dict, fds: list[int]) -> None:
        """Between two students: end everything of the last one, empty the writable places, write the notebooks."""
        try:
            files = request.get("files")
            if not self.shared or len(fds) != 1 or not isinstance(files, list):
                raise ValueError("a reset needs a shared zygote, one file descriptor and a list of files")
            _kill_descendants()
            self.child, self.status = 0, None
            for folder in WRITABLE:
                _empty(folder, self.kept)
            _remove_ipc_objects()
            left = _left_behind(self.kept)
            if left:
                raise ValueError(f"could not remove {', '.join(left[:3])}")
            with os.fdopen(fds.pop(), "rb") as source:
                for entry in files:
                    name, size = entry if isinstance(entry, list) and len(entry) == 2 else (None, None)
                    if not _valid_name(name) or not isinstance(size, int) or size < 0:
                        raise ValueError("a file entry that is not [name, size]")
                    data = source.read(size)
                    if len(data) != size:
                        raise ValueError(f"{name} is cut short")
                    fd = os.open(os.path.join(NOTEBOOKS, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                                 0o444)
                    with os.fdopen(fd, "wb") as target:
                        target.write(data)
        except (OSError, ValueError) as error:
            for fd in fds:
                os.close(fd)
            self.reply({"error": f"reset failed: {str(error)[:200]}"})
            return
        self.reply({"reset": True})

    def serve(self) -> None:
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self.control, 1 << 16, 4)
            except OSError:
                return
            if not data:
                for fd in fds:
                    os.close(fd)
                return
            try:
                request = json.loads(data.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                request = {}
            op = request.get("op")
            if op == "fork":
                self.fork(request, fds)
                continue
            if op == "reset":
                self.reset(request, fds)
                continue
            for fd in fds:
                os.close(fd)
            if op == "status":
                self.reply({"status": self.wait_child(float(request.get("seconds", 2.0)))})
            elif op == "ping":
                self.reply({"pong": True})
            elif op == "end":
                _kill_descendants()
                self.child, self.status = 0, None
                self.reply({"ended": True})
            else:
                self.reply({"error": f"unknown request {str(op)[:40]!r}"})


def main(argv: list[str]) -> None:
    control = socket.socket(fileno=int(argv[0]))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdin = open(os.devnull, encoding="utf-8")  # noqa: SIM115 - kept open for the life of the process
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    imported = []
    names = [n for n in argv[1].split(",") if n]
    for name in [n for n in names if "." not in n]:  # the frameworks
        for module in _MODULES.get(name, ()):
            try:
                importlib.import_module(module)
                imported.append(module)
            except ImportError:
                pass
    for dotted in [n for n in names if "." in n]:  # the tripwires' names, looked up as a student process will
        module_name, _, attribute = dotted.rpartition(".")
        try:
            getattr(importlib.import_module(module_name), attribute)
        except Exception:  # what is not there is not set as a tripwire either
            pass
    if "torch" in imported:
        from .monitor import warm_up

        warm_up()
        # The checks ask a student process for gradients with given output gradients: the first such call imports
        # modules for 0.7 s, once here rather than in every process forked.
        import torch

        x = torch.ones(2, requires_grad=True)
        torch.autograd.grad(x * x, x, torch.ones(2))
    # What is imported now is never collected: no collection in a student process walks (and so copies) the
    # zygote's objects, which are shared with it until written to.
    gc.freeze()
    shared = len(argv) > 2 and argv[2] == "shared"
    if shared:
        _prctl(_PR_SET_DUMPABLE, 0)  # no student process may read or write this process's memory
    zygote = Zygote(control, shared)
    try:
        zygote.reply({"ready": True, "imported": imported})
        zygote.serve()
    finally:
        _kill_descendants()
        os._exit(0)
