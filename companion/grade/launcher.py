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

Limits, set before the process starts and inherited by whatever it starts: address space (``--memory``), CPU
time, file size, no core files, and a process count (a ``pids`` cgroup when the grader may create one, else
``RLIMIT_NPROC`` above the user's current count). The process leads its own session; the grader is a child
subreaper (``PR_SET_CHILD_SUBREAPER``), so a process that detaches (``setsid``, double fork) is re-parented to the
grader rather than to init, and :meth:`Child.kill` ends the session, the cgroup, the pid namespace and every
re-parented descendant, and waits for them, before the grader writes a verdict.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import platform
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .notebooks import leaves_folder
from .seccomp import filter_fd, filter_program

#: Default address-space limit of the student's process (``--memory``).
DEFAULT_MEMORY = 4 * 10**9
#: Processes the student's code may have at once (its own included).
MAX_PROCESSES = 64
#: The largest file the student's code may write (its /tmp is private and in memory).
MAX_FILE_BYTES = 64 * 2**20
SANDBOX_LIB = "/sandbox/lib"
#: The user and group the student's process runs as inside its user namespace (``nobody``).
SANDBOX_ID = 65534
_PR_SET_CHILD_SUBREAPER = 36
_TAIL_BYTES = 4000
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


def _children_of(pid: int) -> set[int]:
    found = set()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as file:
                fields = file.read().rpartition(")")[2].split()
        except OSError:
            continue
        if len(fields) > 1 and fields[1] == str(pid):
            found.add(int(entry))
    return found


def _python_roots() -> list[str]:
    """Folders the sandbox needs read-only to run this Python with its packages."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    roots |= {os.path.realpath(p) for p in list(roots)}
    roots.add(os.path.dirname(sys.executable))
    return sorted(r for r in roots if r and os.path.isdir(r) and r != "/")


def _system_binds() -> list[str]:
    args: list[str] = []
    for path in ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin"):
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/localtime", "/etc/nsswitch.conf"):
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    return args


def _sandbox_package() -> str:
    return str(Path(__file__).resolve().parent / "sandbox")


def tmpfs_bytes(memory: int) -> int:
    """The size of each writable place of the sandbox (``/tmp``, ``/dev/shm``): an eighth of the memory budget,
    at most 256 MiB, so the student's files count against ``--memory`` like its allocations."""
    return max(min(memory // 8, MAX_FILE_BYTES * 4), 2**20)


def bwrap_command(notebooks: Path | list[Path] | None, memory: int = DEFAULT_MEMORY,
                  seccomp_fd: int | None = None) -> list[str]:
    """The bubblewrap command line, up to (not including) the program to run; each notebook is bound read-only
    at ``/sandbox/notebook/NAME`` (the notebooks of one folder: their names differ).

    The process runs as ``nobody`` (uid and gid 65534) of a user namespace of its own, with every capability
    dropped and no way to create another user namespace, so it cannot remount a read-only bind (run as root or
    not); ``seccomp_fd`` holds the filter of :mod:`.seccomp`. Its only writable places are ``/tmp`` and
    ``/dev/shm``, tmpfs of :func:`tmpfs_bytes` each.
    """
    bwrap = shutil.which("bwrap") or "bwrap"
    size = str(tmpfs_bytes(memory))
    args = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--uid", str(SANDBOX_ID), "--gid",
            str(SANDBOX_ID), "--cap-drop", "ALL", "--die-with-parent", "--new-session", "--proc", "/proc",
            "--dev", "/dev", "--perms", "01777", "--size", size, "--tmpfs", "/tmp",
            "--perms", "01777", "--size", size, "--tmpfs", "/dev/shm", "--dir", "/sandbox"]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    args += _system_binds()
    for device in sorted(glob.glob("/dev/nvidia*")) + sorted(glob.glob("/dev/dxg")):  # a GPU, where there is one
        args += ["--dev-bind", device, device]
    for root in _python_roots():
        if not any(root.startswith(prefix + "/") or root == prefix for prefix in ("/usr", "/lib", "/bin")):
            args += ["--ro-bind", root, root]
    args += ["--ro-bind", _sandbox_package(), f"{SANDBOX_LIB}/sandbox"]
    listed = [notebooks] if isinstance(notebooks, Path) else list(notebooks or [])
    for notebook in listed:
        if notebook.is_file() and not leaves_folder(notebook):  # only files inside the student's folder
            args += ["--ro-bind", str(notebook.resolve()), f"/sandbox/notebook/{notebook.name}"]
    # bubblewrap's own root and its /dev are tmpfs of half the RAM each: read-only, so that /tmp and /dev/shm
    # stay the only writable places.
    args += ["--remount-ro", "/dev", "--remount-ro", "/"]
    args += ["--chdir", "/sandbox/notebook" if notebooks is not None else "/tmp"]
    return args


#: Passed through to the student's process as the grader has them, so both sides compute the same way (TensorFlow's
#: oneDNN setting included: the grader leaves it at TensorFlow's default unless its own environment sets it).
_ENV_KEPT = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "KERAS_BACKEND", "COMPANION_DEVICE", "CUDA_VISIBLE_DEVICES",
             "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "LANG", "LC_ALL", "TF_ENABLE_ONEDNN_OPTS",
             "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "COURSE_SEED")


def child_environment() -> dict[str, str]:
    """The student's process's whole environment: what :data:`_ENV_KEPT` names, and the settings set here."""
    env = {name: os.environ[name] for name in _ENV_KEPT if name in os.environ}
    env.update(PATH="/usr/bin:/bin", HOME="/tmp", TMPDIR="/tmp", PYTHONHASHSEED="0", PYTHONDONTWRITEBYTECODE="1",
               TF_CPP_MIN_LOG_LEVEL="3", NVIDIA_TF32_OVERRIDE="0", MPLBACKEND="Agg",
               KERAS_HOME="/tmp/.keras", PYTHONIOENCODING="utf-8")
    return env


@functools.lru_cache(maxsize=1)
def sandbox_status() -> tuple[bool, str]:
    """(usable, why not): whether bubblewrap can start a Python here; tried once per process."""
    if not sys.platform.startswith("linux"):
        return False, f"bubblewrap needs Linux (this is {sys.platform})"
    if os.environ.get("COMPANION_GRADE_SANDBOX", "").lower() == "off":
        return False, "switched off by COMPANION_GRADE_SANDBOX=off"
    if shutil.which("bwrap") is None:
        return False, "bubblewrap (bwrap) is not installed"
    seccomp_fd = filter_fd()
    command = [*bwrap_command(None, seccomp_fd=seccomp_fd), sys.executable, "-I", "-c", "print('ok')"]
    try:
        done = subprocess.run(command, capture_output=True, timeout=60, env=child_environment(),
                              stdin=subprocess.DEVNULL, pass_fds=() if seccomp_fd is None else (seccomp_fd,))
    except (OSError, subprocess.TimeoutExpired) as error:
        return False, f"bubblewrap could not start ({error})"
    finally:
        if seccomp_fd is not None:
            os.close(seccomp_fd)
    if done.returncode != 0 or done.stdout.strip() != b"ok":
        reason = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
        return False, f"bubblewrap could not start ({reason[0][:200]})"
    return True, ""


def seccomp_note() -> str:
    """Empty when the sandbox's seccomp filter is used; else why not (said beside ``sandbox: on``)."""
    if filter_program() is None:
        return f"no seccomp filter for this architecture ({platform.machine()})"
    if not hasattr(os, "memfd_create"):
        return "no seccomp filter (no memfd_create)"
    return ""


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

    def join(self) -> None:
        """Called in the child before exec: move itself into the cgroup."""
        if self.path is not None:
            with open(self.path / "cgroup.procs", "w", encoding="ascii") as file:
                file.write(str(os.getpid()))

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
    too.
    """

    def __init__(self, notebook: Path | list[Path] | None, limits: Limits, sandbox: bool,
                 zygote: list[str] | None = None) -> None:
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
            entry, arguments = "sandbox.zygote", [str(passed[0]), ",".join(zygote)]
        self.tail = b""
        self.output_bytes = 0
        self.cgroup = _Cgroup(limits.processes + 4) if limits.processes else _Cgroup.__new__(_Cgroup)
        if not limits.processes:
            self.cgroup.path = None
        nproc = None
        if self.cgroup.path is None and os.geteuid() != 0 and limits.processes:
            nproc = _user_process_count() + limits.processes
        self.before = _children_of(os.getpid())
        library = SANDBOX_LIB if sandbox else str(Path(_sandbox_package()).parent)
        program = [sys.executable, "-I", "-c",
                   f"import sys; sys.path.insert(0, sys.argv[3]); from {entry} import main; main(sys.argv[1:3])",
                   *arguments, library]
        seccomp_fd = filter_fd() if sandbox else None
        if seccomp_fd is not None:
            passed = (*passed, seccomp_fd)
        command = [*bwrap_command(notebook, limits.memory or DEFAULT_MEMORY, seccomp_fd), *program] if sandbox \
            else program
        first = notebook if isinstance(notebook, Path) or notebook is None else (notebook[0] if notebook else None)
        cgroup = self.cgroup

        def prepare() -> None:  # runs in the new process, before exec
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            if limits.memory:
                resource.setrlimit(resource.RLIMIT_AS, (limits.memory, limits.memory))
            resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 5))
            resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_FILE_BYTES, MAX_FILE_BYTES))
            if nproc is not None:
                resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
            cgroup.join()

        env = child_environment()
        _SPAWN.acquire()
        try:
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=out_w, stderr=out_w, pass_fds=passed,
                start_new_session=True, preexec_fn=prepare, env=env, close_fds=True,
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
                strays = _children_of(os.getpid()) - self.before - _LIVE - {self.process.pid}
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
