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

A class worker (:mod:`companion.grade.classworker`) keeps one zygote for all the students it grades, one after
another (:func:`share`): a zygote started ``shared`` in a sandbox of its own kind, which each student's grader
first resets with that student's notebooks (:meth:`Zygote.reset`: everything of the previous student is
ended and removed, see :mod:`companion.grade.sandbox.zygote`), so a student's process starts without the imports'
seconds and still from the same pristine state, in a sandbox holding only that student's files. Without the
sandbox there is no shared zygote: each student gets zygotes of its own, as above.
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

from .control import ControlLost, receive_json
from .launcher import Child, Limits, OutputTail
from .notebooks import leaves_folder
from .remote import SandboxLost
from .shortcuts import tripwire_names

#: Seconds the zygote may take to answer a request (fork, end, status) before it is killed whole.
CONTROL_TIMEOUT = 30.0


class ZygoteLost(Exception):
    """The zygote did not answer in time, died, or answered nonsense."""


class Zygote:
    """One contained fork server for the notebooks of one folder, importing ``frameworks`` once (``shared``: for
    one student after another, see :meth:`reset`)."""

    def __init__(self, key: tuple, notebooks: list[Path], frameworks: list[str], limits: Limits,
                 sandbox: bool, shared: bool = False) -> None:
        self.key = key
        self.sandbox = sandbox
        self.shared = shared
        self.memory = limits.memory
        self.busy = False
        self.dead = False
        self.ready: bool | None = None
        self.lost: SandboxLost | None = None
        self.lock = threading.Lock()
        # One process more than a student's process has: the zygote itself.
        self.child = Child([] if shared else notebooks,
                           replace(limits, processes=limits.processes + 1 if limits.processes else 0), sandbox,
                           zygote=frameworks, shared=shared)

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
        try:
            reply = receive_json(self.child.control, seconds)
        except ControlLost as error:
            raise ZygoteLost(str(error)) from None
        if "error" in reply:
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

    def reset(self, notebooks: list[Path]) -> None:
        """A shared zygote, for the next student: end and remove everything of the last one, then write
        ``notebooks`` (those inside the student's folder, as they are bound otherwise) into the sandbox.
        Raises :class:`ZygoteLost` (the zygote is then killed whole)."""
        files = [path for path in notebooks if path.is_file() and not leaves_folder(path)]
        contents = [path.read_bytes() for path in files]
        fd = os.memfd_create("companion-grade-notebooks", os.MFD_CLOEXEC)
        try:
            for data in contents:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            os.lseek(fd, 0, os.SEEK_SET)
            names = [[path.name, len(data)] for path, data in zip(files, contents, strict=True)]
            reply = self.request({"op": "reset", "files": names}, (fd,))
        finally:
            os.close(fd)
        if not reply.get("reset"):
            self.kill()
            raise ZygoteLost("the reset was not confirmed")

    def ping(self, seconds: float = 10.0) -> bool:
        """Whether the zygote answers (a shared one, between two students); one that does not is killed whole."""
        if self.dead:
            return False
        try:
            return bool(self.request({"op": "ping"}, seconds=seconds).get("pong"))
        except ZygoteLost:
            return False

    def kill(self) -> None:
        self.dead = True
        self.child.kill()


#: The shared zygote of this process's class worker, if any (:func:`share`, :func:`shared_zygote`).
_SHARED: list[Zygote] = []


def share(zygote: Zygote | None) -> None:
    """Offer ``zygote`` (a shared one, ready) to the graders forked from now on; None: no shared zygote."""
    _SHARED[:] = [zygote] if zygote is not None else []


def shared_zygote() -> Zygote | None:
    """The shared zygote offered to this process (a grader forked by a class worker), or None."""
    return _SHARED[0] if _SHARED and not _SHARED[0].dead else None


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
    same time), each with the limits given for its folder (a forked process may only lower its CPU limit).

    ``shared``: a shared zygote (:func:`shared_zygote`) used, after a :meth:`Zygote.reset`, for the notebooks of
    the only folder graded, one at a time; when it is busy or fails, zygotes of their own take over.
    """

    def __init__(self, folders: dict[Path, list[Path]], limits: dict[Path, Limits], sandbox: bool,
                 shared: Zygote | None = None) -> None:
        self.folders = folders
        self.limits = limits
        self.sandbox = sandbox
        self.all: list[Zygote] = []
        self.lock = threading.Lock()
        usable = shared is not None and sandbox and len(folders) == 1 and shared.ready and not shared.dead
        self.shared = shared if usable else None
        self.shared_folder = next(iter(folders)) if usable else None
        self.shared_reset = False

    def _shared_for(self, folder: Path) -> Zygote | None:
        """The shared zygote, reset for ``folder``'s student, if it may serve a notebook of ``folder`` now."""
        zygote = self.shared
        if zygote is None or folder != self.shared_folder or zygote.dead or zygote.busy:
            return None
        if not self.shared_reset:
            try:
                zygote.reset(self.folders[folder])
            except (ZygoteLost, OSError):
                zygote.kill()
                self.shared = None
                return None
            self.shared_reset = True
        return zygote

    def _start(self, key: tuple) -> Zygote:
        folder, frameworks = key
        notebooks = self.folders.get(folder, [])
        tripwires = tripwire_names(path.stem for path in notebooks)  # imported once, by the zygote
        zygote = Zygote(key, notebooks, [*frameworks, *tripwires], self.limits.get(folder, Limits()), self.sandbox)
        self.all.append(zygote)
        return zygote

    def prepare(self, path: Path, frameworks: list[str]) -> None:
        """Start a zygote for ``path``'s folder unless there is one (it imports while other notebooks are graded)."""
        key = (path.parent, tuple(frameworks))
        with self.lock:
            if self.shared is not None and path.parent == self.shared_folder:
                return
            if not any(z.key == key and not z.dead for z in self.all):
                self._start(key)

    def fork(self, path: Path, frameworks: list[str], cpu_seconds: int) -> Forked:
        """A student process for ``path``, forked when :meth:`Forked.start` is called."""
        key = (path.parent, tuple(frameworks))
        with self.lock:
            zygote = self._shared_for(path.parent) or next(
                (z for z in self.all if z.key == key and not z.dead and not z.busy), None)
            if zygote is None:
                zygote = self._start(key)
            zygote.busy = True
        return Forked(zygote, cpu_seconds, self._release)

    def _release(self, zygote: Zygote) -> None:
        with self.lock:
            zygote.busy = False
            if zygote.dead and zygote in self.all:
                self.all.remove(zygote)
        if zygote.dead and zygote is not self.shared:
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
        """End every zygote and everything in its sandbox, and wait for them; of the shared zygote, every process
        it forked (it is killed whole when it does not confirm)."""
        with self.lock:
            zygotes, self.all = self.all, []
            shared, self.shared = self.shared, None
        for zygote in zygotes:
            zygote.kill()
        if shared is not None and not shared.dead:
            try:
                shared.request({"op": "end"})
            except ZygoteLost:
                pass  # killed whole by request()
