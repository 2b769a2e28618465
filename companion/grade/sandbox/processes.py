"""The child processes of a process, read from ``/proc``: used inside the sandbox (the zygote ends what a student
process left behind) and on the trusted side (the grader ends what was re-parented to it). Standard library only.
"""

from __future__ import annotations

import os


def children_of(pid: int) -> set[int]:
    """The process ids whose parent is ``pid`` now (empty where ``/proc`` cannot be read)."""
    found: set[int] = set()
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
