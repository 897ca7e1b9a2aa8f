"""The NIXL data plane: the relay registers each version's flat host buffer with a NIXL (UCX)
agent and hands out its agent metadata and buffer address; the worker READs the buffer
straight into its own registered memory, without the relay's CPU copying bytes.

This module holds the agent setup both sides share and the worker's reader (NixlClient);
the relay's side is relay_svc/nixl_server.py."""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
import uuid

import torch

from relayrl.contracts.proto.v1 import relay_pb2
from relayrl_torch.weights.manifest import WeightError

DESCRIPTOR = struct.Struct("<QQQ")  # address, length, device id
_PROGRESS_POLL_US = 10_000  # longest sleep of the relay's idle UCX progress thread
_patch_lock = threading.Lock()


def nixl_api():
    try:
        from nixl_cu12 import _api
    except ImportError:
        try:
            from nixl import _api
        except ImportError as err:
            raise WeightError(f"data plane 'nixl' needs the nixl-cu12 package ({err})") from None
    if not os.environ.get("NIXL_LOG_LEVEL"):  # it logs every agent creation to stdout
        logging.getLogger("nixl").setLevel(logging.WARNING)
    return _api


def available() -> bool:
    try:
        nixl_api()
    except WeightError:
        return False
    return True


def nixl_errors(api) -> tuple[type[BaseException], ...]:
    bindings = api.nixlBind
    return tuple(v for v in vars(bindings).values()
                 if isinstance(v, type) and issubclass(v, Exception))


def make_agent(api, role: str, progress_thread: bool):
    name = f"relayrl-{role}-{os.uname().nodename}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    config = api.nixl_agent_config(enable_prog_thread=progress_thread, backends=["UCX"])
    try:
        if not progress_thread:
            return api.nixl_agent(name, config)
        # nixl_agent sets the progress thread's poll timeout to 0, so it spins a core while
        # idle; the thread wakes on UCX's event fd anyway, the timeout only bounds its sleep.
        bindings, make = api.nixlBind, api.nixlBind.nixlAgent

        def with_poll_timeout(agent_name, agent_config):
            agent_config.pthrDelay = _PROGRESS_POLL_US
            return make(agent_name, agent_config)

        with _patch_lock:
            bindings.nixlAgent = with_poll_timeout
            try:
                return api.nixl_agent(name, config)
            finally:
                bindings.nixlAgent = make
    except (RuntimeError, *nixl_errors(api)) as err:
        raise WeightError(f"data plane 'nixl': cannot start a UCX agent: {err}") from None


class NixlClient:
    """The worker's agent: one READ of the relay's buffer per pull, polled to completion."""

    def __init__(self):
        self._api = nixl_api()
        self._errors = nixl_errors(self._api)
        self._agent = make_agent(self._api, "worker", progress_thread=False)
        self.name = self._agent.name
        self._lock = threading.Lock()
        self._remote: tuple[str, bytes] | None = None  # relay agent loaded, its metadata
        self._staging: tuple[torch.Tensor, object] | None = None  # buffer kept registered
        self._abandoned: list[tuple[object, torch.Tensor]] = []  # reads never cancelled

    def read(self, ticket: relay_pb2.NixlTicket, size: int, timeout_s: float,
             out: torch.Tensor | None = None) -> torch.Tensor:
        """The relay's `size`-byte buffer, read into `out` (a reused buffer that stays
        registered) or into fresh memory."""
        if not size:
            return torch.empty(0, dtype=torch.uint8)
        whole = len(ticket.descriptors) % DESCRIPTOR.size == 0
        remote = list(DESCRIPTOR.iter_unpack(ticket.descriptors)) if whole else []
        if sum(r[1] for r in remote) != size:
            raise WeightError(f"NIXL ticket from {ticket.agent_name!r} does not describe "
                              f"{size} bytes")
        with self._lock:
            try:
                return self._read(ticket, remote, size, timeout_s, out)
            except (WeightError, *self._errors) as err:
                self._disconnect()  # the next pull connects afresh
                if isinstance(err, WeightError):
                    raise
                raise WeightError(f"NIXL read from {ticket.agent_name!r} failed: "
                                  f"{type(err).__name__} {err}") from None

    def _disconnect(self) -> None:
        if self._remote is not None:
            try:
                self._agent.remove_remote_agent(self._remote[0])
            except self._errors:
                pass
            self._remote = None

    def _read(self, ticket, remote, size, timeout_s, out) -> torch.Tensor:
        agent = self._agent
        if self._remote != (ticket.agent_name, ticket.agent_metadata):
            if self._remote is not None and self._remote[0] != ticket.agent_name:
                self._disconnect()  # another relay, or a restarted one
            # A known relay's newer metadata (versions registered since) loads over the old
            # on the same connection; reconnecting would leave a socket open on the relay.
            self._remote = None
            agent.add_remote_agent(ticket.agent_metadata)
            self._remote = (ticket.agent_name, ticket.agent_metadata)
        flat, registration = self._local_buffer(size, out)
        handle, state = None, "ERR"
        try:
            handle = agent.initialize_xfer("READ", agent.get_xfer_descs(flat),
                                           agent.get_xfer_descs(remote, "DRAM"),
                                           ticket.agent_name)
            state = agent.transfer(handle)
            deadline = time.monotonic() + timeout_s
            while state == "PROC" and time.monotonic() < deadline:
                state = agent.check_xfer_state(handle)
        finally:
            if handle is not None:
                try:
                    agent.release_xfer_handle(handle)  # cancels a read still in flight
                except self._errors:
                    self._abandoned.append((handle, flat))  # UCX may still write into it
                    registration = None
            if registration is not None:
                agent.deregister_memory(registration)
        if state == "PROC":
            raise WeightError(f"NIXL read of {size} bytes from {ticket.agent_name!r} timed "
                              f"out after {timeout_s:.0f}s")
        if state != "DONE":
            raise WeightError(f"NIXL read of {size} bytes from {ticket.agent_name!r} failed")
        return flat

    def _local_buffer(self, size: int, out: torch.Tensor | None):
        """The receive buffer and, for fresh memory, its registration to drop after the read."""
        if out is None or out.numel() < size:
            flat = torch.empty(size, dtype=torch.uint8)
            return flat, self._agent.register_memory(flat)
        held = self._staging
        if held is None or (held[0].data_ptr(), held[0].numel()) != (out.data_ptr(), out.numel()):
            if held is not None:
                self._agent.deregister_memory(held[1])
                self._staging = None
            # holding `out` keeps its memory from being freed and reused while registered
            self._staging = (out, self._agent.register_memory(out))
        return out[:size], None
