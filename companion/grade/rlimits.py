"""The first program of every student process: set its limits, join its cgroup, then exec the real command.

    python -I -S rlimits.py LIMITS_JSON COMMAND...

The grader's trusted process runs checkers (NumPy, PyTorch) in some threads while it starts student processes from
others. Setting the limits in ``subprocess.Popen(preexec_fn=...)`` made CPython start each process with ``fork()``,
which runs every library's fork handlers in the trusted process: OpenBLAS's shuts its thread pool down, and a
checker thread inside a threaded matrix product then waits for ever for workers that are gone (issue #36: the
grader livelocked for 40 minutes). Without ``preexec_fn`` CPython starts the process with ``vfork()``, which runs
no fork handler; this small program, exec'd first, does in the new process what ``preexec_fn`` did.

``LIMITS_JSON`` is ``{"rlimits": [[name, soft, hard], ...], "cgroup": path or null}`` with names such as
``RLIMIT_AS``. It imports only the standard library (it runs with ``-I -S``, outside the sandbox, before it) and
exits with status 126 and a message on its standard error when a limit cannot be set.
"""

from __future__ import annotations

import json
import os
import resource
import sys

#: Exit status when a limit could not be set (as a shell says for a command it cannot run).
CANNOT_LIMIT = 126


def apply(limits: dict) -> None:
    """Set the rlimits of ``limits`` on this process and move it into its cgroup (if any)."""
    for name, soft, hard in limits.get("rlimits", []):
        resource.setrlimit(getattr(resource, name), (int(soft), int(hard)))
    cgroup = limits.get("cgroup")
    if cgroup:
        with open(os.path.join(cgroup, "cgroup.procs"), "w", encoding="ascii") as file:
            file.write(str(os.getpid()))


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        sys.stderr.write("usage: rlimits.py LIMITS_JSON COMMAND...\n")
        os._exit(CANNOT_LIMIT)
    try:
        apply(json.loads(argv[0]))
        os.execvp(argv[1], argv[1:])  # PATH of the environment given to the process (as Popen searched it)
    except Exception as error:  # noqa: BLE001 - any failure: the grader reads a student process that did not start
        sys.stderr.write(f"companion.grade: cannot start the student's process with its limits: "
                         f"{type(error).__name__}: {error}\n")
        sys.stderr.flush()
        os._exit(CANNOT_LIMIT)


if __name__ == "__main__":
    main(sys.argv[1:])
