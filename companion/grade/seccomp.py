"""A seccomp filter for the student's process, written as classic BPF by hand (no library needed).

bubblewrap installs it (``--seccomp FD``) just before it starts the student's program. The filter refuses, with
``EPERM``, the system calls that change what the process can see or reach: mounting and unmounting (old and new
mount API), new or other namespaces (``unshare``, ``setns``), ``ptrace`` and reading or writing another process's
memory, the kernel keyring, ``bpf``, ``perf_event_open``, ``userfaultfd``, file handles, ``chroot`` and
``pivot_root``, kernel modules, ``kexec``, ``reboot``, swap, ``acct``, ``quotactl``, the kernel log, and POSIX
message queues (``mq_open``: a queue outlives its processes and cannot be listed, so students graded one after
another in one sandbox could pass messages through it). System
calls of another architecture's convention (32-bit ``int 0x80`` on x86-64, x32) are refused whole, so the numbers
below cannot be dodged. Every other call is allowed: the student's code still computes, threads, forks (inside the
process limit), reads what the sandbox shows and writes its private ``/tmp``.

Only x86-64 and AArch64 are known; elsewhere :func:`filter_program` returns None and the sandbox runs without the
filter (bubblewrap's dropped capabilities and disabled user namespaces still refuse these calls).
"""

from __future__ import annotations

import os
import platform
import struct

# Linux's seccomp and BPF constants (linux/seccomp.h, linux/filter.h, linux/audit.h).
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_EPERM = 1
_OFFSET_NR, _OFFSET_ARCH = 0, 4  # struct seccomp_data: int nr; __u32 arch; ...

#: The refused calls, by name (the same set on every architecture).
REFUSED = (
    "mount", "umount2", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    "pivot_root", "chroot", "unshare", "setns", "ptrace", "process_vm_readv", "process_vm_writev", "keyctl",
    "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd", "name_to_handle_at", "open_by_handle_at",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot", "swapon",
    "swapoff", "acct", "quotactl", "syslog", "vhangup", "mq_open",
)

_X86_64 = {
    "mount": 165, "umount2": 166, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
    "fsmount": 432, "fspick": 433, "mount_setattr": 442, "pivot_root": 155, "chroot": 161, "unshare": 272,
    "setns": 308, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "keyctl": 250, "add_key": 248,
    "request_key": 249, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "name_to_handle_at": 303,
    "open_by_handle_at": 304, "init_module": 175, "finit_module": 313, "delete_module": 176, "kexec_load": 246,
    "kexec_file_load": 320, "reboot": 169, "swapon": 167, "swapoff": 168, "acct": 163, "quotactl": 179,
    "syslog": 103, "vhangup": 153, "mq_open": 240,
}
_AARCH64 = {
    "mount": 40, "umount2": 39, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
    "fsmount": 432, "fspick": 433, "mount_setattr": 442, "pivot_root": 41, "chroot": 51, "unshare": 97,
    "setns": 268, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "keyctl": 219, "add_key": 217,
    "request_key": 218, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "name_to_handle_at": 264,
    "open_by_handle_at": 265, "init_module": 105, "finit_module": 273, "delete_module": 106, "kexec_load": 104,
    "kexec_file_load": 294, "reboot": 142, "swapon": 224, "swapoff": 225, "acct": 89, "quotactl": 60,
    "syslog": 116, "vhangup": 58, "mq_open": 180,
}
#: machine name -> (AUDIT_ARCH value, system call numbers, first number of a foreign convention or None)
_ARCHITECTURES = {
    "x86_64": (0xC000003E, _X86_64, 0x40000000),  # x32 calls carry bit 30
    "aarch64": (0xC00000B7, _AARCH64, None),
}


def _instruction(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def filter_program(machine: str | None = None) -> bytes | None:
    """The BPF program (``struct sock_filter[]`` as bytes) for ``machine`` (default: this one), or None."""
    known = _ARCHITECTURES.get(machine or platform.machine())
    if known is None:
        return None
    arch, numbers, foreign = known
    refused = sorted({numbers[name] for name in REFUSED})
    program = [_instruction(_LD_W_ABS, _OFFSET_ARCH)]
    # Wrong architecture: jump to the final "refuse" (counted from the next instruction).
    tail = 1 + (1 if foreign is not None else 0) + len(refused) + 1  # load nr, [x32 test], tests, allow
    program.append(_instruction(_JEQ_K, arch, 0, tail))
    program.append(_instruction(_LD_W_ABS, _OFFSET_NR))
    remaining = len(refused) + 1  # from the next instruction to "refuse": the tests and "allow"
    if foreign is not None:
        program.append(_instruction(_JGE_K, foreign, remaining, 0))
    for index, number in enumerate(refused):
        program.append(_instruction(_JEQ_K, number, len(refused) - index, 0))
    program.append(_instruction(_RET_K, _RET_ALLOW))
    program.append(_instruction(_RET_K, _RET_ERRNO | _EPERM))
    return b"".join(program)


def filter_fd() -> int | None:
    """A file descriptor (not inheritable; pass it explicitly) holding the filter, positioned at its start."""
    program = filter_program()
    if program is None:
        return None
    fd = os.memfd_create("companion-grade-seccomp", os.MFD_CLOEXEC) if hasattr(os, "memfd_create") else None
    if fd is None:
        return None
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
