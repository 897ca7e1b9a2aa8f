"""Which machine (and boot) this process runs on: shared memory only works within one."""

from __future__ import annotations

import functools
import socket


@functools.cache
def host_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "unknown-boot"
    return f"{socket.gethostname()}/{boot}"
