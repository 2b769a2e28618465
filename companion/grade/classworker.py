"""The class grader's workers: each imports the grading code and the frameworks once, then forks one grader per student.

``python -m companion.grade class`` grades each student with the single-student command in a process of its own.
Starting that command imports NumPy, PyTorch, TensorFlow and every chapter's checks, seconds of CPU per student.
A :class:`Worker` (one per ``--jobs`` slot) is a trusted process, started once, that does those imports and then,
for each student, forks a process that runs exactly that command (:func:`companion.grade.__main__.main` with the
same arguments, its output in the student's log): a fresh copy of the state right after the imports, in a session
of its own, so it is stopped, times out and reports its exit status like a started command. The student's code
never runs in a worker or in a forked grader (it runs in the grader's sandboxed student processes, as always), a
grader that hangs or crashes fails only its own student, and a worker that cannot start or stops answering is
replaced by the plain command (:func:`companion.grade.classroom._run_grader`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading

#: Seconds a worker may take to import the grading code and the frameworks.
STARTUP_TIMEOUT = 300.0
#: Seconds a worker may take to fork a grader.
FORK_TIMEOUT = 60.0


class WorkerLost(Exception):
    """The worker did not start, did not answer in time, or died."""


class Worker:
    """A trusted process that forks one single-student grader per request (one request at a time)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        fd = theirs.detach()
        try:
            self.process = subprocess.Popen([sys.executable, "-m", "companion.grade.classworker", str(fd)],
                                            pass_fds=(fd,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL, env=env)
        finally:
            os.close(fd)
        self.ready = False

    def _receive(self, seconds: float | None) -> dict:
        self.control.settimeout(seconds)
        try:
            data = self.control.recv(1 << 16)
        except TimeoutError:
            raise
        except OSError as error:
            raise WorkerLost(str(error)) from None
        if not data:
            raise WorkerLost("the worker exited")
        try:
            message = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise WorkerLost("an answer that is not JSON") from None
        if not isinstance(message, dict):
            raise WorkerLost("an answer that is not an object")
        return message

    def wait_ready(self) -> None:
        """Wait for the worker's imports (the first time); raise :class:`WorkerLost` when it does not start."""
        if self.ready:
            return
        try:
            if not self._receive(STARTUP_TIMEOUT).get("ready"):
                raise WorkerLost("the worker did not start")
        except (OSError, TimeoutError, WorkerLost) as error:
            self.close()
            raise WorkerLost(str(error) or type(error).__name__) from None
        self.ready = True

    def start(self, argv: list[str], log: str) -> ForkedGrader:
        """Fork a grader running ``python -m companion.grade ARGV`` with its output appended to ``log``."""
        self.wait_ready()
        try:
            self.control.send(json.dumps({"argv": argv, "log": log}).encode("utf-8"))
            pid = self._receive(FORK_TIMEOUT).get("pid")
        except (OSError, TimeoutError) as error:
            self.close()
            raise WorkerLost(str(error) or type(error).__name__) from None
        except WorkerLost:
            self.close()
            raise
        if not isinstance(pid, int) or pid <= 0:
            self.close()
            raise WorkerLost("the worker could not fork")
        return ForkedGrader(self, pid)

    def close(self) -> None:
        """End the worker (it is not a grader: nothing of a student's is lost)."""
        self.control.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class ForkedGrader:
    """A grader forked by a :class:`Worker`; ``pid``, ``wait`` and ``returncode`` as of a ``subprocess.Popen``."""

    def __init__(self, worker: Worker, pid: int) -> None:
        self.worker = worker
        self.pid = pid
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        try:
            message = self.worker._receive(timeout)
        except TimeoutError:
            raise subprocess.TimeoutExpired(f"grader {self.pid}", timeout or 0) from None
        except WorkerLost:  # the worker died: the grader was its child, so it is gone or orphaned
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except OSError:
                pass
            self.returncode = -signal.SIGKILL
            return self.returncode
        code = message.get("exit")
        self.returncode = code if isinstance(code, int) else 1
        return self.returncode


class Slots:
    """The workers of one class run: one per job slot (thread), started on the slot's first student."""

    def __init__(self) -> None:
        self.on = False
        self.workers: list[Worker] = []
        self.local = threading.local()
        self.lock = threading.Lock()

    def open(self) -> None:
        self.on = True

    def worker(self, env: dict[str, str]) -> Worker | None:
        """This slot's worker (None when workers are off, or this slot's failed: the command is started then)."""
        if not self.on:
            return None
        worker = getattr(self.local, "worker", None)
        if worker is None and not getattr(self.local, "failed", False):
            try:
                worker = self.local.worker = Worker(env)
            except OSError:
                self.local.failed = True
                return None
            with self.lock:
                self.workers.append(worker)
        return worker

    def drop(self) -> None:
        """This slot's worker failed: its next students are graded by the started command."""
        worker = getattr(self.local, "worker", None)
        if worker is not None:
            worker.close()
        self.local.worker, self.local.failed = None, True

    def close(self) -> None:
        """End every worker (after the graders they forked have ended)."""
        with self.lock:
            workers, self.workers, self.on = self.workers, [], False
        for worker in workers:
            worker.close()


# ---------------------------------------------------------------------------------------------------------------
# The worker process
# ---------------------------------------------------------------------------------------------------------------


def _grader(argv: list[str], log: str) -> int:
    """In the forked process: the single-student command, its output appended to ``log``."""
    output = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(output)
    from companion.grade import __main__ as command

    sys.argv = [command.__file__, *argv]

    try:
        code = command.main(argv)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:  # as the interpreter would: the traceback, exit status 1
        import traceback

        traceback.print_exc()
        code = 1
    return code


def serve(control: socket.socket) -> None:
    while True:
        data = control.recv(1 << 16)
        if not data:
            return
        request = json.loads(data.decode("utf-8"))
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                control.close()
                os.close(ready_r)
                os.setsid()  # a session of its own: the class grader stops it with its process group
                os.close(ready_w)
                signal.signal(signal.SIGINT, signal.default_int_handler)
                code = _grader([str(a) for a in request["argv"]], str(request["log"]))
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        os.close(ready_w)
        os.read(ready_r, 1)  # end of file once the child leads its session
        os.close(ready_r)
        control.send(json.dumps({"pid": pid}).encode("utf-8"))
        _, status = os.waitpid(pid, 0)
        control.send(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode("utf-8"))


def main(argv: list[str]) -> None:
    control = socket.socket(fileno=int(argv[0]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the class grader, which stops what is running
    from companion.checks import registry
    from companion.grade import __main__  # noqa: F401 - what the command imports
    from companion.grade.launcher import sandbox_status
    from companion.grade.runner import _import_quietly

    registry()
    sandbox_status()  # probed once here (it is cached), not by every grader forked from this worker
    for module in ("torch", "keras"):
        _import_quietly(module)
    control.send(json.dumps({"ready": True}).encode("utf-8"))
    serve(control)


if __name__ == "__main__":
    main(sys.argv[1:])
