"""The seccomp filter of the isolated sandbox's commands: the kernel keyring calls fail with ENOSYS.

Every sandbox runs as the same host uid, and the kernel keeps a user's keyrings per uid, not per
mount or PID namespace: without this filter a key one command adds (`add_key`) is read back by
another workspace, later, under another backend (a channel between rollouts), and one workspace can
fill the uid's key quota for all the others, on the host, for good. Programs treat ENOSYS as "this
kernel has no keyrings" and carry on without them.

The filter is a classic BPF program (`struct sock_filter` array) in the form bubblewrap's
`--seccomp FD` reads: what `seccomp_export_bpf` writes. It checks the calling ABI first: a 32-bit
process on a 64-bit kernel uses other numbers for the same calls.
"""

from __future__ import annotations

import errno
import platform
import struct

# <linux/audit.h> AUDIT_ARCH_* values, and the numbers of add_key, request_key and keyctl there.
_KEYRING_CALLS: dict[str, list[tuple[int, tuple[int, ...]]]] = {
    "x86_64": [(0xC000003E, (248, 249, 250)), (0x40000003, (286, 287, 288))],  # x86-64 (and x32), i386
    "aarch64": [(0xC00000B7, (217, 218, 219)), (0x40000028, (309, 310, 311))],  # arm64, arm
}
_X32_SYSCALL_BIT = 0x40000000  # x32 calls are the x86-64 numbers with this bit, under the same arch

_LD_ABS_W, _JEQ_K, _AND_K, _RET_K = 0x20, 0x15, 0x54, 0x06
_OFFSET_NR, _OFFSET_ARCH = 0, 4  # in struct seccomp_data
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000


def keyring_filter(machine: str | None = None) -> bytes | None:
    """The compiled filter for this machine's architecture, or None where the numbers are not known
    here (the sandbox then runs without it)."""
    arches = _KEYRING_CALLS.get(machine or platform.machine())
    if arches is None:
        return None
    deny = "deny"
    program: list[tuple[int, int | str, int | str, int]] = []  # code, jt, jf, k; str jumps are labels
    labels: dict[str, int] = {}
    program.append((_LD_ABS_W, 0, 0, _OFFSET_ARCH))
    for i, (arch, numbers) in enumerate(arches):
        nxt = f"arch{i + 1}"
        program.append((_JEQ_K, 0, nxt, arch))
        program.append((_LD_ABS_W, 0, 0, _OFFSET_NR))
        if arch == 0xC000003E:
            program.append((_AND_K, 0, 0, ~_X32_SYSCALL_BIT & 0xFFFFFFFF))
        program += [(_JEQ_K, deny, 0, n) for n in numbers]
        program.append((_RET_K, 0, 0, _RET_ALLOW))
        labels[nxt] = len(program)  # reached with the arch still loaded: a failed JEQ changes nothing
    program.append((_RET_K, 0, 0, _RET_ALLOW))  # an ABI not listed: nothing known to deny
    labels[deny] = len(program)
    program.append((_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS))

    def offset(here: int, target: int | str) -> int:
        if isinstance(target, int):
            return target
        jump = labels[target] - here - 1  # jumps count the instructions skipped after this one
        assert 0 <= jump < 256, jump
        return jump

    return b"".join(
        struct.pack("=HBBI", code, offset(pc, jt), offset(pc, jf), k) for pc, (code, jt, jf, k) in enumerate(program)
    )
