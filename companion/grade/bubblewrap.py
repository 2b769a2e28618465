"""The bubblewrap command line of the student's sandbox, the environment it gets, and whether it can start here.

:func:`bwrap_command` builds the sandbox that :mod:`companion.grade.launcher` starts the student's process in (see
that module and ``book/grading.md`` for what it holds, as root and as a user); :func:`sandbox_status` tries it once
per process.
"""

from __future__ import annotations

import functools
import glob
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from .notebooks import leaves_folder
from .seccomp import filter_fd, filter_program

#: Default address-space limit of the student's process (``--memory``).
DEFAULT_MEMORY = 4 * 10**9
#: The largest file the student's code may write (its /tmp is private and in memory).
MAX_FILE_BYTES = 64 * 2**20
SANDBOX_LIB = "/sandbox/lib"
#: The user and group the student's process runs as inside its user namespace (``nobody``).
SANDBOX_ID = 65534


def _python_roots() -> list[str]:
    """Folders the sandbox needs read-only to run this Python with its packages."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    roots |= {os.path.realpath(p) for p in list(roots)}
    roots.add(os.path.dirname(sys.executable))
    # Package folders that a .pth adds (a virtual environment sharing another's packages): never the course itself.
    roots |= {p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")}
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
                  seccomp_fd: int | None = None, shared: bool = False) -> list[str]:
    """The bubblewrap command line, up to (not including) the program to run; each notebook is bound read-only
    at ``/sandbox/notebook/NAME`` (the notebooks of one folder: their names differ).

    ``shared``: the sandbox of a zygote that serves one student after another (:mod:`.sandbox.zygote`); no
    notebook is bound, ``/sandbox/notebook`` is a third tmpfs of :func:`tmpfs_bytes`, into which the zygote
    writes each student's notebooks after emptying it.

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
    if shared:
        args += ["--perms", "01777", "--size", size, "--tmpfs", "/sandbox/notebook"]
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
    args += ["--chdir", "/sandbox/notebook" if (notebooks is not None or shared) else "/tmp"]
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
