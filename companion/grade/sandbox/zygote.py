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
  process that detaches stays its descendant), wait for them, and answer; only then does the next ``fork`` come.

The grader never relies on this process for containment: it keeps its own time limits on every answer, and it
ends the whole sandbox (:meth:`companion.grade.launcher.Child.kill`) when this process does not answer in time,
and always before it writes a report.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import resource
import signal
import socket
import sys
import time
import warnings

_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_PDEATHSIG = 1
_MODULES = {"torch": ("torch",), "keras": ("keras",)}


def _prctl(option: int, value: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as file:
                    fields = file.read().rpartition(")")[2].split()
            except OSError:
                continue
            if len(fields) > 1 and fields[1] == str(pid):
                found.append(int(entry))
    return found


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
        children = _children(me)
        if not children:
            return
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.005)


class Zygote:
    def __init__(self, control: socket.socket) -> None:
        self.control = control
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
            for fd in fds:
                os.close(fd)
            if op == "status":
                self.reply({"status": self.wait_child(float(request.get("seconds", 2.0)))})
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
    for name in [n for n in argv[1].split(",") if n]:
        for module in _MODULES.get(name, ()):
            try:
                importlib.import_module(module)
                imported.append(module)
            except ImportError:
                pass
    zygote = Zygote(control)
    try:
        zygote.reply({"ready": True, "imported": imported})
        zygote.serve()
    finally:
        _kill_descendants()
        os._exit(0)
