"""trainer.mmap_threshold_mib: with a fixed glibc mmap threshold, large blocks freed between
live small ones go back to the system at once; with glibc's own (raised to the largest
block freed so far) they stay resident. Each case runs in a child process, since the
setting holds for the whole process."""

import subprocess
import sys
import textwrap

import pytest

from relayrl.config import ConfigError, RunConfig
from relayrl.config.base import load_model

CHILD = textwrap.dedent("""
    import os, sys
    from relayrl.runtime.procs import set_mmap_threshold

    if sys.argv[1] == "fixed":
        assert set_mmap_threshold(4)
    def rss():
        return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    warm = bytearray(6 << 20)
    del warm  # glibc's own threshold now lies above the 5 MiB blocks below
    base = rss()
    big, small = [], []
    for _ in range(40):  # 200 MiB of large blocks, each followed by a small one kept alive
        big.append(bytearray(5 << 20))
        small.append(bytearray(1000))
    del big
    print((rss() - base) >> 20)
""")


def resident_after_free_mib(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True,
                         check=True, timeout=120)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_fixed_threshold_returns_freed_large_blocks_at_once():
    assert resident_after_free_mib("default") > 100
    assert resident_after_free_mib("fixed") < 20


@pytest.mark.parametrize("value", [0, 33])
def test_the_threshold_is_bounded_by_what_glibc_takes(value):
    with pytest.raises(ConfigError, match="trainer.mmap_threshold_mib"):
        load_model(RunConfig, {"trainer": {"mmap_threshold_mib": value}}, "run.yaml")
