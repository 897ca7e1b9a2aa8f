"""Ports picked for configs and tests: never handed out twice by one process in a while, so a
config assembled from several picks never uses a port twice (a run refuses that)."""

import pytest

from relayrl.runtime.grpc_util import PORT_RANGE_ENV, PORT_SPAN, free_ports, reserve_ports
from relayrl_testkit.ports import free_port_block

pytestmark = pytest.mark.unit


def test_separate_picks_never_repeat_a_port():
    picked = [p for _ in range(300) for p in free_ports(2)]
    assert len(set(picked)) == len(picked)


def test_picks_leave_room_for_the_ports_derived_from_them():
    """A config's worker i serves on base_port + i; a port picked after the config's (a test's
    HTTP base) once landed one below its trainer's, so worker 1's HTTP port was the trainer's."""
    picked = sorted(p for _ in range(60) for p in free_ports(3))
    assert min(b - a for a, b in zip(picked, picked[1:], strict=False)) >= PORT_SPAN


def test_a_block_neither_overlaps_earlier_picks_nor_is_handed_out_again():
    before = set(free_ports(20))
    first = free_port_block(4)
    block = set(range(first, first + 4))
    assert not block & before
    after = {p for _ in range(100) for p in free_ports(1)}
    assert not block & after


def test_a_reservation_clashing_with_a_recent_pick_is_refused():
    (port,) = free_ports(1)
    assert not reserve_ports([port])
    assert reserve_ports([])


def test_ports_lie_below_the_range_outgoing_connections_get():
    """A port from the ephemeral range can be taken by any client's connection before the
    service meant to have it binds it (a worker failed to start so in a loaded CI run)."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral = int(f.read().split()[0])
    assert all(p < ephemeral - 256 for _ in range(50) for p in free_ports(4))


def test_picks_stay_in_the_range_the_environment_gives(monkeypatch):
    """Parallel test workers each draw from their own slice, so they never pick alike."""
    monkeypatch.setenv(PORT_RANGE_ENV, "40000-40400")
    assert all(40000 <= p < 40400 for p in free_ports(10))
    for bad, named in (("40000", "not LOW-HIGH"), ("500-600", "1024 <= LOW < HIGH")):
        monkeypatch.setenv(PORT_RANGE_ENV, bad)
        with pytest.raises(ValueError, match=f"RELAYRL_PORT_RANGE: '{bad}'.*{named}"):
            free_ports(1)
