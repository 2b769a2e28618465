"""The class grader's workers: each imports the grading code and the frameworks once, then forks one grader per student.

``python -m companion.grade class`` grades each student with the single-student command in a process of its own.
Starting that command imports NumPy, PyTorch, TensorFlow and every chapter's checks, seconds of CPU per student.
A :class:`Worker` (one per ``--jobs`` slot) is a trusted process, started once, that does those imports and then,
for each student, forks a process that runs exactly that command (:func:`companion.grade.command.main` with the
same arguments, its output in the student's log): a fresh copy of the state right after the imports, in a session
of its own, so it is stopped, times out and reports its exit status like a started command. The student's code
never runs in a worker or in a forked grader (it runs in the grader's sandboxed student processes, as always), a
grader that hangs or crashes fails only its own student, and a worker that cannot start or stops answering is
replaced by the plain command (:func:`companion.grade.classroom._run_grader`).

Where the sandbox works, a worker also keeps a shared zygote (:mod:`.forkserver`, :mod:`.sandbox.zygote`): a
sandboxed process that imported NumPy, PyTorch and TensorFlow once, from which every student process of every
student of this slot is forked, after the student's grader has emptied the sandbox of the previous student's
processes, files and IPC objects and put this student's notebooks in it (:meth:`.forkserver.Zygote.reset`). After
each grader the worker asks the zygote whether it still answers, and replaces it with a fresh one when it does not
(or when the grader ended abnormally: what it left half-done in the zygote is not trusted).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from .control import ControlLost, receive_json

#: Seconds a worker may take to import the grading code and the frameworks.
STARTUP_TIMEOUT = 300.0
#: Seconds a worker may take to fork a grader.
FORK_TIMEOUT = 60.0


class WorkerLost(Exception):
    """The worker did not start, did not answer in time, or died."""


class Worker:
    """A trusted process that forks one single-student grader per request (one request at a time)."""

    def __init__(self, env: dict[str, str], memory: int, share_sandbox: bool = True) -> None:
        """``memory``: the address-space limit of the students' processes (``--memory``, in bytes);
        ``share_sandbox``: keep a shared zygote (where the sandbox works)."""
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        fd = theirs.detach()
        try:
            self.process = subprocess.Popen([sys.executable, "-m", "companion.grade.classworker", str(fd),
                                             str(memory), "share" if share_sandbox else "own"],
                                            pass_fds=(fd,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL, env=env)
        finally:
            os.close(fd)
        self.ready = False

    def receive(self, seconds: float | None) -> dict:
        """The worker's next message; raises ``TimeoutError``, or :class:`WorkerLost` when it is gone."""
        try:
            return receive_json(self.control, seconds)
        except ControlLost as error:
            raise WorkerLost(str(error)) from None

    def wait_ready(self) -> None:
        """Wait for the worker's imports (the first time); raise :class:`WorkerLost` when it does not start."""
        if self.ready:
            return
        try:
            if not self.receive(STARTUP_TIMEOUT).get("ready"):
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
            reply = self.receive(FORK_TIMEOUT)
            pid = reply.get("pid")
        except (OSError, TimeoutError) as error:
            self.close()
            raise WorkerLost(str(error) or type(error).__name__) from None
        except WorkerLost:
            self.close()
            raise
        if not isinstance(pid, int) or pid <= 0:
            self.close()
            raise WorkerLost("the worker could not fork")
        return ForkedGrader(self, pid, reply.get("shared"))

    def close(self) -> None:
        """End the worker (it is not a grader: nothing of a student's is lost)."""
        self.control.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class ForkedGrader:
    """A grader forked by a :class:`Worker`; ``pid``, ``wait`` and ``returncode`` as of a ``subprocess.Popen``.

    ``shared``: whether its students' code ran in the worker's shared zygote (None when sharing was not asked for);
    False means the shared zygote could not start, and the grader started zygotes of its own (slower, as safe)."""

    def __init__(self, worker: Worker, pid: int, shared: bool | None = None) -> None:
        self.worker = worker
        self.pid = pid
        self.shared = shared
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        try:
            message = self.worker.receive(timeout)
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
        self.share_sandbox = True
        self.threads = 1
        self.workers: list[Worker] = []
        self.local = threading.local()
        self.lock = threading.Lock()
        self.unshared = 0  # graders of this run whose worker could not start its shared zygote

    def open(self, share_sandbox: bool = True, threads: int = 1) -> None:
        """Start workers from now on; ``share_sandbox``: each keeps a shared zygote (where the sandbox works);
        ``threads``: compute threads per grader (:data:`companion.grade.classroom.COMPUTE_THREADS`)."""
        if threads < 1:
            raise ValueError(f"threads must be at least 1; got {threads}")
        self.on, self.share_sandbox, self.threads, self.unshared = True, share_sandbox, threads, 0

    def worker(self, env: dict[str, str], memory: int) -> Worker | None:
        """This slot's worker (None when workers are off, or this slot's failed: the command is started then)."""
        if not self.on:
            return None
        worker = getattr(self.local, "worker", None)
        if worker is None and not getattr(self.local, "failed", False):
            try:
                worker = self.local.worker = Worker(env, memory, self.share_sandbox)
            except OSError:
                self.local.failed = True
                return None
            with self.lock:
                self.workers.append(worker)
        return worker

    def count_unshared(self) -> None:
        with self.lock:
            self.unshared += 1

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
    from companion.grade import command

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


class SharedSandbox:
    """The worker's shared zygote: started at once (it imports while the worker does), replaced when it fails."""

    def __init__(self, memory: int) -> None:
        self.memory = memory
        self.zygote = None
        self.start()

    def start(self) -> None:
        from companion.grade.forkserver import Zygote
        from companion.grade.launcher import Limits
        from companion.grade.shortcuts import tripwire_names

        # Generous CPU limit for the zygote itself: each student process lowers its own at the fork.
        self.zygote = Zygote(("shared", ("torch", "keras")), [], ["torch", "keras", *tripwire_names()],
                             Limits(memory=self.memory, cpu_seconds=10**6), True, shared=True)

    def ready(self) -> bool:
        """Wait for the zygote's imports (starting a fresh one when it is gone); whether it is usable."""
        from companion.grade.forkserver import share
        from companion.grade.remote import SandboxLost

        if self.zygote is None or self.zygote.dead:
            self.start()
        try:
            self.zygote.wait_ready(time.monotonic() + STARTUP_TIMEOUT)
        except SandboxLost:
            self.zygote.kill()
            share(None)
            return False
        share(self.zygote)
        return True

    def after(self, sound: bool) -> None:
        """After a grader: keep the zygote if the grader ended normally and the zygote still answers."""
        from companion.grade.forkserver import share

        if not (sound and self.zygote.ping()):
            self.zygote.kill()  # the whole sandbox, waited for: a fresh one is started for the next student
            share(None)


def serve(control: socket.socket, shared: SharedSandbox | None) -> None:
    asked = shared is not None
    while True:
        data = control.recv(1 << 16)
        if not data:
            return
        request = json.loads(data.decode("utf-8"))
        if shared is not None and not shared.ready():
            shared = None  # the shared zygote cannot start: each grader starts zygotes of its own
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
        control.send(json.dumps({"pid": pid, "shared": (shared is not None) if asked else None}).encode("utf-8"))
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if shared is not None:
            shared.after(code in (0, 1))
        control.send(json.dumps({"exit": code}).encode("utf-8"))


def _warm_up() -> None:
    """What the checkers do first in every grader, done once here: autograd's first call imports much of PyTorch."""
    import torch

    x = torch.ones(2, requires_grad=True)
    torch.autograd.grad((x * x).sum(), x)
    torch.autograd.grad(x * x, x, torch.ones(2))  # given output gradients, autograd imports another 0.7 s of modules


def main(argv: list[str]) -> None:
    control = socket.socket(fileno=int(argv[0]))
    memory, share_sandbox = int(argv[1]), argv[2] == "share"
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the class grader, which stops what is running
    from companion.grade.launcher import sandbox_status

    shared = None
    if share_sandbox and sandbox_status()[0]:  # probed once here (it is cached), not by every grader forked
        shared = SharedSandbox(memory)  # imports the frameworks in its sandbox while this process imports below
    from companion.checks import registry
    from companion.grade import command  # noqa: F401 - what the command imports
    from companion.grade.runner import import_quietly

    registry()
    # What every grader imports on its way (the notebook reader, the course's layers the checkers compare with):
    # imported here once, each forked grader starts with them.
    for module in ("torch", "keras", "jupytext", "companion.torch", "companion.keras"):
        import_quietly(module)
    try:
        _warm_up()
    except Exception:  # a missing framework: the graders import what they need
        pass
    control.send(json.dumps({"ready": True}).encode("utf-8"))
    serve(control, shared)


if __name__ == "__main__":
    main(sys.argv[1:])
