"""The sandbox's seccomp filter: a few lines of classic BPF, written by hand (no libseccomp).

bubblewrap loads it (``--seccomp FD``) just before it runs the kernel. It refuses, with ``EPERM``:

- creating a user namespace (``clone``/``unshare`` with ``CLONE_NEWUSER``): inside one, code gets
  capabilities over namespaces of its own (a tmpfs without size limit, netfilter, …), the kernel's
  largest attack surface for unprivileged code; and ``clone3`` answers ``ENOSYS`` (its flags sit in
  memory a filter cannot read), which makes glibc fall back to ``clone``;
- the kernel interfaces a notebook never needs and that keep turning up in privilege escalations:
  keyrings, ``bpf``, ``perf_event_open``, ``userfaultfd``, io_uring, ``ptrace``, the mount API,
  ``setns``, ``open_by_handle_at``;
- any system call made through another ABI (x32, or i386 through ``int 0x80``), which would otherwise
  bypass the numbers below.

Only x86-64 and AArch64 are described; elsewhere `build_filter` returns None and the sandbox runs
without a filter (namespaces and rlimits still apply).
"""

from __future__ import annotations

import errno
import platform
import struct

_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}

# Linux system call numbers per architecture (arch/x86/entry/syscalls/syscall_64.tbl and
# include/uapi/asm-generic/unistd.h).
_DENIED: dict[str, dict[str, int]] = {
    "x86_64": {
        "ptrace": 101,
        "pivot_root": 155,
        "mount": 165,
        "umount2": 166,
        "add_key": 248,
        "request_key": 249,
        "keyctl": 250,
        "perf_event_open": 298,
        "open_by_handle_at": 304,
        "setns": 308,
        "bpf": 321,
        "userfaultfd": 323,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "open_tree": 428,
        "move_mount": 429,
        "fsopen": 430,
        "fsconfig": 431,
        "fsmount": 432,
        "fspick": 433,
        "mount_setattr": 442,
    },
    "aarch64": {
        "umount2": 39,
        "mount": 40,
        "pivot_root": 41,
        "ptrace": 117,
        "add_key": 217,
        "request_key": 218,
        "keyctl": 219,
        "perf_event_open": 241,
        "open_by_handle_at": 265,
        "setns": 268,
        "bpf": 280,
        "userfaultfd": 282,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "open_tree": 428,
        "move_mount": 429,
        "fsopen": 430,
        "fsconfig": 431,
        "fsmount": 432,
        "fspick": 433,
        "mount_setattr": 442,
    },
}
_CLONE = {"x86_64": 56, "aarch64": 220}
_UNSHARE = {"x86_64": 272, "aarch64": 97}
_CLONE3 = 435
_X32_SYSCALL_BIT = 0x40000000
CLONE_NEWUSER = 0x10000000

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6] (little endian).
_NR, _ARCH, _ARG0_LOW = 0, 4, 16

_LD_W_ABS = 0x00 | 0x00 | 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x05 | 0x10 | 0x00  # BPF_JMP | BPF_JEQ | BPF_K
_JSET_K = 0x05 | 0x40 | 0x00  # BPF_JMP | BPF_JSET | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K

_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def build_filter(machine: str | None = None) -> bytes | None:
    """The filter as bubblewrap reads it (an array of ``struct sock_filter``), or None if the machine's
    architecture is not one this module knows."""
    arch = machine or platform.machine()
    if arch not in _AUDIT_ARCH:
        return None
    eperm = _RET_ERRNO | errno.EPERM
    prog = [
        _insn(_LD_W_ABS, _ARCH),
        _insn(_JEQ_K, _AUDIT_ARCH[arch], jt=1, jf=0),
        _insn(_RET_K, eperm),
        _insn(_LD_W_ABS, _NR),
    ]
    if arch == "x86_64":
        prog += [_insn(_JSET_K, _X32_SYSCALL_BIT, jt=0, jf=1), _insn(_RET_K, eperm)]
    for nr in sorted(_DENIED[arch].values()):
        prog += [_insn(_JEQ_K, nr, jt=0, jf=1), _insn(_RET_K, eperm)]
    prog += [_insn(_JEQ_K, _CLONE3, jt=0, jf=1), _insn(_RET_K, _RET_ERRNO | errno.ENOSYS)]
    # Last, because they load the first argument over the syscall number.
    for nr in (_CLONE[arch], _UNSHARE[arch]):
        prog += [
            _insn(_JEQ_K, nr, jt=0, jf=4),
            _insn(_LD_W_ABS, _ARG0_LOW),
            _insn(_JSET_K, CLONE_NEWUSER, jt=0, jf=1),
            _insn(_RET_K, eperm),
            _insn(_RET_K, _RET_ALLOW),
        ]
    prog.append(_insn(_RET_K, _RET_ALLOW))
    return b"".join(prog)
