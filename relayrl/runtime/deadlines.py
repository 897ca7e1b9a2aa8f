"""Default deadlines of every call between services, in one place.

No call to a peer may wait forever: a peer that hangs (stopped, deadlocked, partitioned)
must look to the caller like one that died, so the caller's own recovery path (fail over,
retry later with relayrl.runtime.outage's backoff, let a lease lapse) runs. Config fields override
these where a run needs it (scheduler.call_timeout_s, relay.timeout_s,
redis.socket_timeout_s); the static check in tests/unit/test_deadlines.py keeps every gRPC
call site passing one.
"""

from __future__ import annotations

CONTROL_CALL_S = 10.0  # a small control RPC (leases, heartbeats, status)
TRANSFER_S = 60.0  # a weight transfer, or its stall, on any data plane
HEALTH_CHECK_S = 1.0  # one health probe
REWARD_CALL_S = 30.0  # a remote reward server scoring a batch
CLI_CALL_S = 3.0  # a command-line status query
REDIS_COMMAND_S = 10.0  # one Redis command, blocking reads included
# A blocking stream read must return before the client's socket timeout fires, or every
# idle read would look like a dead server.
REDIS_BLOCK_MARGIN_S = 1.0
