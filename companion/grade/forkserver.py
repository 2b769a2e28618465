"""Student processes forked from one contained process per folder, so the frameworks are imported once per student.

Importing NumPy, PyTorch and TensorFlow takes seconds; a student's process is needed per notebook (and again after
each step that crashed or ran out of time). A :class:`Zygote` is one contained process
(:class:`~companion.grade.launcher.Child`: the same sandbox, limits, session, cgroup and subreaper as before) that
runs :mod:`companion.grade.sandbox.zygote` for the notebooks of one folder: it imports the frameworks once, then
forks a fresh student process for each notebook (:class:`Forked`, which the grader uses exactly like a
:class:`~companion.grade.launcher.Child`). Each forked process starts from the state right after the imports (a
copy of the zygote's memory), so nothing a notebook's code did (patching NumPy, seeding, global settings) reaches
another notebook, and a crash or time-out ends only its own process: the zygote kills every descendant before the
next fork. The zygote never runs the student's code, but it shares the sandbox with it, so the grader does not rely
on it: every request has a deadline, a zygote that misses one is killed whole (and a fresh one carries on), and
:meth:`Zygotes.close` kills every zygote with :meth:`~companion.grade.launcher.Child.kill` before any report is
written.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path

from .launcher import Child, Limits, OutputTail
from .remote import SandboxLost

#: Seconds the zygote may take to answer a request (fork, end, status) before it is killed whole.
CONTROL_TIMEOUT = 30.0


class ZygoteLost(Exception):
    """The zygote did not answer in time, died, or answered nonsense."""


class Zygote:
    """One contained fork server for the notebooks of one folder, importing ``frameworks`` once."""

    def __init__(self, key: tuple, notebooks: list[Path], frameworks: list[str], limits: Limits,
                 sandbox: bool) -> None:
        self.key = key
        self.sandbox = sandbox
        self.busy = False
        self.dead = False
        self.ready: bool | None = None
        self.lost: SandboxLost | None = None
        self.lock = threading.Lock()
        # One process more than a student's process has: the zygote itself.
        self.child = Child(notebooks, replace(limits, processes=limits.processes + 1 if limits.processes else 0),
                           sandbox, zygote=frameworks)

    def wait_ready(self, deadline: float) -> None:
        """Wait for the imports; raise :class:`SandboxLost` as a student process that cannot start does."""
        with self.lock:
            if self.ready:
                return
            if self.lost is None:
                try:
                    reply = self._receive(max(deadline - time.monotonic(), 0.001))
                except TimeoutError:
                    self.lost = SandboxLost("timeout", "time limit")
                except ZygoteLost:
                    self.lost = SandboxLost("crash", self.child.exit_description())
                else:
                    if reply.get("ready"):
                        self.ready = True
                        return
                    self.lost = SandboxLost("protocol", "it did not start")
                self.dead = True
            raise self.lost

    def _receive(self, seconds: float) -> dict:
        self.child.control.settimeout(seconds)
        try:
            data = self.child.control.recv(1 << 16)
        except TimeoutError:
            raise TimeoutError() from None
        except OSError as error:
            raise ZygoteLost(str(error)) from None
        if not data:
            raise ZygoteLost("closed")
        try:
            reply = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ZygoteLost("an answer that is not JSON") from None
        if not isinstance(reply, dict) or "error" in reply:
            raise ZygoteLost(f"an unexpected answer {str(reply)[:80]}")
        return reply

    def request(self, message: dict, fds: tuple[int, ...] = (), seconds: float = CONTROL_TIMEOUT) -> dict:
        """Send one request (with file descriptors) and return the answer; a zygote that fails is killed whole."""
        try:
            socket.send_fds(self.child.control, [json.dumps(message).encode("utf-8")], list(fds))
            return self._receive(seconds)
        except (OSError, TimeoutError, ZygoteLost) as error:
            self.kill()
            raise ZygoteLost(str(error) or type(error).__name__) from None

    def kill(self) -> None:
        self.dead = True
        self.child.kill()


class Forked(OutputTail):
    """A student process forked by a :class:`Zygote`: the pipes and output of a :class:`Child`, and its end."""

    def __init__(self, zygote: Zygote, cpu_seconds: int, release) -> None:
        self.zygote = zygote
        self.cpu_seconds = cpu_seconds
        self.release = release
        to_child_r, self.to_child = os.pipe()
        self.from_child, from_child_w = os.pipe()
        self.out, out_w = os.pipe()
        self.theirs: tuple[int, ...] = (to_child_r, from_child_w, out_w)
        self.forked = False
        self.start_failed = False
        self.ended = False
        self.tail = b""
        self.output_bytes = 0
        self.reader_thread = threading.Thread(target=self._drain, daemon=True)
        self.reader_thread.start()

    def start(self, deadline: float) -> None:
        """Wait for the zygote's imports and fork; raise :class:`SandboxLost` when that fails."""
        try:
            try:
                self.zygote.wait_ready(deadline)
            except SandboxLost:
                self.start_failed = True
                raise
            try:
                self.zygote.request({"op": "fork", "cpu_seconds": self.cpu_seconds}, self.theirs)
            except ZygoteLost:
                self.start_failed = True
                raise SandboxLost("crash", self.zygote.child.exit_description()) from None
            self.forked = True
        finally:
            for fd in self.theirs:
                os.close(fd)
            self.theirs = ()

    def tail_text(self) -> str:
        if self.start_failed:
            return self.zygote.child.tail_text()
        text = self.tail.decode("utf-8", "replace").strip()
        return text[-1000:]

    def exit_description(self) -> str:
        """As :meth:`Child.exit_description` says it for a process of its own (under bubblewrap, whose exit
        status is 128 + the signal's number for a process killed by a signal)."""
        if not self.forked:
            return self.zygote.child.exit_description()
        try:
            status = self.zygote.request({"op": "status", "seconds": 2.0}, seconds=2.0 + CONTROL_TIMEOUT).get("status")
        except ZygoteLost:
            return self.zygote.child.exit_description()
        if not isinstance(status, int):
            return "it stopped answering"
        if os.WIFSIGNALED(status):
            number = os.WTERMSIG(status)
            if self.zygote.sandbox:
                return f"exit code {128 + number}"
            try:
                return f"killed by signal {signal.Signals(number).name}"
            except ValueError:
                return f"killed by signal {number}"
        return f"exit code {os.waitstatus_to_exitcode(status)}"

    def kill(self) -> None:
        """End the process and everything it started (the zygote kills its descendants and waits for them)."""
        if self.ended:
            return
        self.ended = True
        for fd in self.theirs:
            os.close(fd)
        self.theirs = ()
        if self.forked and not self.zygote.dead:
            try:
                self.zygote.request({"op": "end"})
            except ZygoteLost:
                pass  # killed whole by request()
        for fd in (self.to_child, self.from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        self.reader_thread.join(5)
        try:
            os.close(self.out)
        except OSError:
            pass
        self.release(self.zygote)


class Zygotes:
    """The zygotes of one grading run: one per folder and set of frameworks (one more per notebook graded at the
    same time), each with the limits given for its folder (a forked process may only lower its CPU limit)."""

    def __init__(self, folders: dict[Path, list[Path]], limits: dict[Path, Limits], sandbox: bool) -> None:
        self.folders = folders
        self.limits = limits
        self.sandbox = sandbox
        self.all: list[Zygote] = []
        self.lock = threading.Lock()

    def _start(self, key: tuple) -> Zygote:
        folder, frameworks = key
        zygote = Zygote(key, self.folders.get(folder, []), list(frameworks), self.limits.get(folder, Limits()),
                        self.sandbox)
        self.all.append(zygote)
        return zygote

    def prepare(self, path: Path, frameworks: list[str]) -> None:
        """Start a zygote for ``path``'s folder unless there is one (it imports while other notebooks are graded)."""
        key = (path.parent, tuple(frameworks))
        with self.lock:
            if not any(z.key == key and not z.dead for z in self.all):
                self._start(key)

    def fork(self, path: Path, frameworks: list[str], cpu_seconds: int) -> Forked:
        """A student process for ``path``, forked when :meth:`Forked.start` is called."""
        key = (path.parent, tuple(frameworks))
        with self.lock:
            zygote = next((z for z in self.all if z.key == key and not z.dead and not z.busy), None)
            if zygote is None:
                zygote = self._start(key)
            zygote.busy = True
        return Forked(zygote, cpu_seconds, self._release)

    def _release(self, zygote: Zygote) -> None:
        with self.lock:
            zygote.busy = False
            if zygote.dead and zygote in self.all:
                self.all.remove(zygote)
        if zygote.dead:
            zygote.kill()  # every process of its sandbox ended and waited for (again: harmless)

    def close_folder(self, folder: Path) -> None:
        """Every notebook of ``folder`` is graded: end its zygotes now rather than at :meth:`close`."""
        with self.lock:
            done = [z for z in self.all if z.key[0] == folder and not z.busy]
            for zygote in done:
                self.all.remove(zygote)
        for zygote in done:
            zygote.kill()

    def close(self) -> None:
        """End every zygote and everything in its sandbox, and wait for them."""
        with self.lock:
            zygotes, self.all = self.all, []
        for zygote in zygotes:
            zygote.kill()
