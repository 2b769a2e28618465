"""Start the student's process, contained, and end it together with everything it started.

The grader starts one such process per folder of notebooks: the zygote of :mod:`companion.grade.forkserver`, which
forks the student process of each notebook inside the same containment (a :class:`Child` can also be a student
process of its own). On Linux the process runs under bubblewrap (``bwrap``, :func:`bwrap_command`): no network,
its own process, IPC, mount and user namespaces, uid 65534 there with every capability dropped and no nested user
namespace, the seccomp filter of :mod:`.seccomp`, size-limited ``/tmp`` and ``/dev/shm`` as its only writable
places, and read-only views of what it needs (the Python installation, the virtual environment,
:mod:`companion.grade.sandbox` and the notebooks being graded, each only if it lies inside the student's folder);
the course (``solutions/``, the checks, the reference implementations), the reports and the rest of the file
system do not exist there. This holds whether the grader runs as root or not. Where
bubblewrap is missing or cannot start (no user namespaces), the process runs without it and the reports say
``sandbox: off``; everything below still holds.

Limits, set before the process runs anything of the sandbox's and inherited by whatever it starts: address space
(``--memory``), CPU time, file size, no core files, and a process count (a ``pids`` cgroup when the grader may
create one, else ``RLIMIT_NPROC`` above the user's current count). They are set by :mod:`.rlimits`, a small program
exec'd first, rather than by ``preexec_fn``, so the process is started with ``vfork()`` and no library's fork
handler runs in this multi-threaded process (issue #36: OpenBLAS's froze a checker thread for good).

The process leads its own session; the grader is a child subreaper (``PR_SET_CHILD_SUBREAPER``), so a process that
detaches (``setsid``, double fork) is re-parented to the grader rather than to init, and :meth:`Child.kill` ends the
session, the cgroup, the pid namespace and every re-parented descendant, and waits for them, before the grader
writes a verdict.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .bubblewrap import (
    DEFAULT_MEMORY,
    MAX_FILE_BYTES,
    SANDBOX_LIB,
    _sandbox_package,
    bwrap_command,
    child_environment,
    sandbox_status,
    seccomp_note,
    tmpfs_bytes,
)
from .sandbox.processes import children_of
from .seccomp import filter_fd

#: The program that sets a student process's limits and then execs it (see its docstring for why).
RLIMITS_PROGRAM = Path(__file__).with_name("rlimits.py")
#: Processes the student's code may have at once (its own included).
MAX_PROCESSES = 64
_PR_SET_CHILD_SUBREAPER = 36
_TAIL_BYTES = 4000
__all__ = ["DEFAULT_MEMORY", "MAX_FILE_BYTES", "MAX_PROCESSES", "Child", "Limits", "OutputTail", "become_subreaper",
           "bwrap_command", "child_environment", "sandbox_status", "seccomp_note", "tmpfs_bytes"]
_counter = iter(range(1, 10**9))
#: The student processes running now (several when notebooks are graded side by side).
_LIVE: set[int] = set()
#: Held while a student process is started and while strays are collected, so one thread's new process is never
#: taken for another's stray.
_SPAWN = threading.Lock()


def become_subreaper() -> bool:
    """Make this process adopt its orphaned descendants (Linux); return whether that worked."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class _Cgroup:
    """A pids cgroup (v2 or v1) for one student process, when the grader may create one (usually as root)."""

    def __init__(self, limit: int) -> None:
        self.path: Path | None = None
        name = f"companion-grade-{os.getpid()}-{next(_counter)}"
        for base in (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup")):
            if not (base / "cgroup.procs").exists() or not os.access(base, os.W_OK):
                continue
            if base.name == "cgroup" and "pids" not in _read(base / "cgroup.subtree_control"):
                continue
            try:
                (base / name).mkdir()
                (base / name / "pids.max").write_text(str(limit))
                self.path = base / name
                return
            except OSError:
                try:
                    (base / name).rmdir()
                except OSError:
                    pass

    def kill_all(self) -> None:
        if self.path is None:
            return
        for _ in range(50):
            pids = [int(p) for p in _read(self.path / "cgroup.procs").split() if p.isdigit()]
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.02)
        for _ in range(50):
            try:
                self.path.rmdir()
                break
            except OSError:
                time.sleep(0.02)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii")
    except OSError:
        return ""


def _user_process_count() -> int:
    uid, count = os.getuid(), 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                count += os.stat(f"/proc/{entry}").st_uid == uid
            except OSError:
                pass
    return count


@dataclass
class Limits:
    memory: int = DEFAULT_MEMORY
    cpu_seconds: int = 3600
    processes: int = MAX_PROCESSES


class OutputTail:
    """The output of a student process, read from the pipe ``self.out`` by a thread: its size and its last bytes."""

    out: int
    tail: bytes = b""
    output_bytes: int = 0

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self.out, 1 << 16)
            except OSError:
                return
            if not data:
                return
            self.output_bytes += len(data)
            self.tail = (self.tail + data)[-_TAIL_BYTES:]


class Child(OutputTail):
    """One student process: its pipes, its captured output, and how to end it for good.

    With ``zygote`` (the frameworks to import, e.g. ``["torch", "keras"]``) the process is the fork server of
    :mod:`.sandbox.zygote` for ``notebook`` (one or a list, of one folder) instead: ``control`` is its socket, and
    the student processes it forks live in the same sandbox, session, cgroup and limits, so :meth:`kill` ends them
    too. ``shared`` (with the sandbox only): the zygote serves one student after another in a sandbox of its own
    kind (:func:`~companion.grade.bubblewrap.bwrap_command`), emptied between them.
    """

    def __init__(self, notebook: Path | list[Path] | None, limits: Limits, sandbox: bool,
                 zygote: list[str] | None = None, shared: bool = False) -> None:
        if shared and not (sandbox and zygote is not None):
            raise ValueError("shared: only a zygote in the sandbox can serve one student after another")
        out_r, out_w = os.pipe()
        if zygote is None:
            to_child_r, self.to_child = os.pipe()
            self.from_child, from_child_w = os.pipe()
            passed = (to_child_r, from_child_w)
            entry, arguments = "sandbox.child", [str(to_child_r), str(from_child_w)]
        else:
            self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self.to_child = self.from_child = -1
            passed = (theirs.detach(),)
            entry, arguments = "sandbox.zygote", [str(passed[0]), ",".join(zygote), "shared" if shared else ""]
        self.tail = b""
        self.output_bytes = 0
        self.cgroup = _Cgroup(limits.processes + 4) if limits.processes else _Cgroup.__new__(_Cgroup)
        if not limits.processes:
            self.cgroup.path = None
        nproc = None
        if self.cgroup.path is None and os.geteuid() != 0 and limits.processes:
            nproc = _user_process_count() + limits.processes
        self.before = children_of(os.getpid())
        library = SANDBOX_LIB if sandbox else str(Path(_sandbox_package()).parent)
        program = [sys.executable, "-I", "-c",
                   f"import sys; sys.path.insert(0, sys.argv[-1]); from {entry} import main; main(sys.argv[1:-1])",
                   *arguments, library]
        seccomp_fd = filter_fd() if sandbox else None
        if seccomp_fd is not None:
            passed = (*passed, seccomp_fd)
        command = [*bwrap_command(notebook, limits.memory or DEFAULT_MEMORY, seccomp_fd, shared), *program] if sandbox \
            else program
        first = notebook if isinstance(notebook, Path) or notebook is None else (notebook[0] if notebook else None)

        # The limits are set by a small program exec'd first (rlimits.py), not by preexec_fn: without preexec_fn
        # CPython starts the process with vfork(), which runs no fork handler in this multi-threaded process (a
        # fork() here shut OpenBLAS's thread pool down under a checker inside a matrix product: issue #36).
        rlimits = [["RLIMIT_CORE", 0, 0]]
        if limits.memory:
            rlimits.append(["RLIMIT_AS", limits.memory, limits.memory])
        rlimits += [["RLIMIT_CPU", limits.cpu_seconds, limits.cpu_seconds + 5],
                    ["RLIMIT_FSIZE", MAX_FILE_BYTES, MAX_FILE_BYTES]]
        if nproc is not None:
            rlimits.append(["RLIMIT_NPROC", nproc, nproc])
        cgroup = self.cgroup.path
        wrapper = [sys.executable, "-I", "-S", str(RLIMITS_PROGRAM),
                   json.dumps({"rlimits": rlimits, "cgroup": str(cgroup) if cgroup is not None else None})]
        env = child_environment()
        _SPAWN.acquire()
        try:
            self.process = subprocess.Popen(
                [*wrapper, *command], stdin=subprocess.DEVNULL, stdout=out_w, stderr=out_w, pass_fds=passed,
                start_new_session=True, env=env, close_fds=True,
                cwd=str(first.resolve().parent) if (first is not None and not sandbox) else None,
            )
            _LIVE.add(self.process.pid)
        finally:
            _SPAWN.release()
            for fd in (*passed, out_w):
                os.close(fd)
        self.out = out_r
        self.reader_thread = threading.Thread(target=self._drain, daemon=True)
        self.reader_thread.start()

    def tail_text(self) -> str:
        text = self.tail.decode("utf-8", "replace").strip()
        return text[-1000:]

    def exit_description(self) -> str:
        try:
            code = self.process.wait(2)
        except subprocess.TimeoutExpired:
            return "it stopped answering"
        if code < 0:
            try:
                return f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"

    def kill(self) -> None:
        """End the process, its session, its cgroup, its pid namespace and every descendant; wait for them."""
        pid = self.process.pid
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            self.process.kill()
        except OSError:
            pass
        self.cgroup.kill_all()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            pass
        _LIVE.discard(pid)
        self.reap()
        for fd in (self.to_child, self.from_child):
            try:
                if fd >= 0:
                    os.close(fd)
            except OSError:
                pass
        if hasattr(self, "control"):
            self.control.close()
        self.reader_thread.join(2)
        try:
            os.close(self.out)
        except OSError:
            pass

    def reap(self) -> None:
        """Kill and wait for the processes re-parented to the grader since this child started (setsid, forks)."""
        for _ in range(100):
            with _SPAWN:
                strays = children_of(os.getpid()) - self.before - _LIVE - {self.process.pid}
            if not strays:
                return
            for stray in strays:
                try:
                    os.kill(stray, signal.SIGKILL)
                except OSError:
                    pass
            for stray in strays:
                try:
                    os.waitpid(stray, 0)
                except ChildProcessError:
                    pass
                except OSError:
                    pass
            time.sleep(0.01)
