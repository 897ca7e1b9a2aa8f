"""The trainer on several processes under torchrun: one per GPU (NCCL), or per CPU slot (gloo).

Launched with `torchrun --nproc-per-node N -m trainer_svc ...`; a plain `python -m trainer_svc`
is a world of one and none of this is active.

Rank 0 leads, the others follow. Rank 0 is the trainer the single-process service is: it
alone reads Redis, publishes weights, writes checkpoints and metrics, and serves the status
endpoint. The other ranks hold the same modules and run only the operations that need every
rank (a policy update, gathering the weights or the training state, a restore). Before rank 0
runs one, it broadcasts the operation's name and small arguments (`Parallel.leading`);
followers loop on those broadcasts (`Parallel.receive`), so the ranks' collectives line up by
construction, and a follower needs no Redis, relay or disk of its own.

A follower waits for the next operation inside a collective, and the process group aborts a
collective that waits longer than its timeout (trainer.dist_timeout_s). Rank 0 may wait far
longer than that between operations: for a batch while rollouts are slow or the run is
paused, for Redis or a relay through an outage, for the disk while it writes a checkpoint. So
from start-up on, a thread of rank 0 leads an idle operation every tenth of the timeout
(`Parallel.start_heartbeat`); followers take it and wait again. Operations and idle ones are
one sequence: a lock keeps an idle operation out of an operation's collectives.

Every rank receives the whole collated batch and computes rewards and advantages on all of
it, so estimators that normalise over the batch (REINFORCE++, PPO's whitening) see the same
numbers as one process. Forward and backward passes then run on the rank's own contiguous
share of the groups (`shard_rows`). Each loss is a mean over the batch's sequences or its
response tokens (`normaliser`): on its share, rank r computes that mean over its own n_r
items, S_r / n_r, and gradients are averaged over the W ranks, so rank r scales its loss by
W * n_r / n. The averaged gradient is then sum_r grad S_r / n: one process's on the batch.

Weights: FSDP2 (`fully_shard` on each decoder layer, then on the root) shards parameters,
gradients and optimizer state; with trainer.fsdp false every rank holds the whole model and
gradients are all-reduced. A rank never holds the whole model it loads: the policy (and the
KL reference) is built on the meta device, sharded, given storage for its shard alone, and
each rank reads its own slices of the model directory's safetensors (`Parallel.read_weights`).
Full weights, for publishing and checkpoints, are gathered onto rank 0's CPU.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from relayrl.config import ConfigError, TrainerConfig
from relayrl_torch.devices import resolve_device
from relayrl_torch.weights.tied import tie, tied_aliases, without
from trainer_svc.precision import Precision, resolve_precision

log = logging.getLogger(__name__)
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
TIMEOUT_S = TrainerConfig.model_fields["dist_timeout_s"].default
IDLE = "idle"  # the operation rank 0 leads when it has none, so followers' waits end
IDLE_SHARE = 10  # idle operations per timeout


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    device: torch.device = torch.device("cpu")
    timeout_s: float = TIMEOUT_S  # a collective's longest wait (trainer.dist_timeout_s)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_world(device: str = "auto", timeout_s: float = TIMEOUT_S) -> World:
    """The world torchrun describes in the environment, with its process group started
    (NCCL on GPUs, gloo on CPUs) under `timeout_s` (trainer.dist_timeout_s); a world of one
    when WORLD_SIZE is unset or 1. `device` is trainer.device, resolved here once
    (relayrl_torch.devices): under torchrun a rank's GPU is cuda:LOCAL_RANK, so a fixed
    cuda:N is refused there."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World(device=resolve_device(device, "trainer.device"))
    missing = [v for v in TORCHRUN_VARS if v not in os.environ]
    if missing:
        raise ConfigError(f"WORLD_SIZE={size} but {', '.join(missing)} unset: launch with "
                         "torchrun (python -m torch.distributed.run)")
    if device.startswith("cuda:"):
        raise ConfigError(f"trainer.device: {device!r} would put all {size} torchrun ranks on "
                         "one GPU; set auto or cuda (each rank takes cuda:LOCAL_RANK)")
    resolved = resolve_device(device, "trainer.device")
    if resolved.type == "cuda":
        torch.cuda.set_device(resolved)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if resolved.type == "cuda" else "gloo",
                                timeout=timedelta(seconds=timeout_s))
    return World(int(os.environ["RANK"]), size, resolved, timeout_s)


def leave_world(world: World) -> None:
    """After a clean stop, the last act of every rank of a world of several: the ranks meet,
    tear the process group down together, so no rank destroys its end of a connection its
    peer is still using (a follower that raced ahead of rank 0 here was seen to die of
    SIGABRT inside gloo), and the process exits at once, without the interpreter's teardown.
    gloo's worker threads live as long as the group, which FSDP2's units and torch's own
    caches hold past destroy_process_group; a worker still releasing its last operation's
    tensors while the interpreter tears down needs the GIL, cannot have it, and aborts the
    process ("terminate called without an active exception"), which torchrun reports as the
    rank failing. In a world of one: nothing."""
    if world.size <= 1 or not dist.is_initialized():
        return
    dist.barrier()
    dist.destroy_process_group()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def shard_rows(group_ids: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """The batch rows of rank `rank`: its contiguous share of whole groups, the groups split
    as evenly by count as they divide. `group_ids` [B] are the rows' group positions."""
    groups = torch.unique_consecutive(group_ids)
    mine = torch.tensor_split(groups, size)[rank]
    return torch.isin(group_ids, mine).nonzero().flatten()


def normaliser(aggregation: str, mask: torch.Tensor) -> torch.Tensor:
    """What a loss of this aggregation divides by: response tokens (token_mean) or
    sequences (the seq_mean_* aggregations)."""
    if aggregation == "token_mean":
        return mask.sum()
    return torch.tensor(float(mask.shape[0]))


class Parallel:
    """How the trainer's modules and batches are spread over a World; with a world of one,
    every method is the plain single-process operation."""

    def __init__(self, world: World | None = None, fsdp: bool = True):
        self.world = world or World()
        self.fsdp = fsdp
        self._mesh = None
        # rank 0's turn to lead: an operation, or an idle one of the heartbeat
        self._turn = threading.Lock()
        self._done = threading.Event()  # the followers stopped, or may be out of step
        self._heartbeat_error: BaseException | None = None

    @property
    def active(self) -> bool:
        return self.world.size > 1

    @property
    def device(self) -> torch.device:
        return self.world.device

    # -- rank 0 leads -----------------------------------------------------------------------

    @contextlib.contextmanager
    def leading(self, op: str, *args: Any) -> Iterator[None]:
        """On rank 0: tell the followers to run `op(*args)` too, and run it inside the `with`,
        with no idle operation in between. Elsewhere: nothing."""
        if not (self.active and self.world.is_main):
            yield
            return
        with self._turn:
            if self._heartbeat_error is not None:
                raise RuntimeError("a follower stopped taking rank 0's operations") \
                    from self._heartbeat_error
            if self._done.is_set():
                raise RuntimeError(f"rank 0 led {op!r} after the followers stopped, or after "
                                   "an operation failed in the middle")
            self._send((op, args))
            try:
                yield
            except BaseException:
                # the followers may still be inside one of its collectives, where any later
                # operation would meet them out of step
                self._done.set()
                raise

    def start_heartbeat(self) -> None:
        """On rank 0: from now until the followers stop, lead an idle operation every tenth
        of the process group's timeout, so that a follower's wait for the next operation
        ends well within it however long rank 0 waits. Elsewhere: nothing."""
        if self.active and self.world.is_main:
            threading.Thread(target=self._beat, name="heartbeat", daemon=True).start()

    def stop_followers(self) -> None:
        """On rank 0: the followers' last operation; no idle one follows it."""
        with self.leading("stop"):
            self._done.set()

    def receive(self) -> tuple[str, tuple]:
        """On a follower: the next operation rank 0 leads (idle ones are taken here)."""
        while True:
            box: list[Any] = [None]
            dist.broadcast_object_list(box, src=0, device=self.device)
            if box[0][0] != IDLE:
                return box[0]

    def _send(self, op: tuple[str, tuple]) -> None:
        dist.broadcast_object_list([op], src=0, device=self.device)

    def _beat(self) -> None:
        if self.device.type == "cuda":  # a thread's current device is its own
            torch.cuda.set_device(self.device)
        while not self._done.wait(self.world.timeout_s / IDLE_SHARE):
            with self._turn:
                if self._done.is_set():
                    return
                try:
                    self._send((IDLE, ()))
                except Exception as err:  # a follower is gone: the next operation says so
                    log.error("rank 0's idle operation failed: %s", err)
                    self._heartbeat_error = err
                    self._done.set()
                    return

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        if not self.active:
            return obj
        box = [obj if self.world.is_main else None]
        dist.broadcast_object_list(box, src=0, device=self.device)
        return box[0]

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """The elementwise sum of `t` over the ranks."""
        return self._all_reduce(t, dist.ReduceOp.SUM)

    def max(self, t: torch.Tensor) -> torch.Tensor:
        """The elementwise maximum of `t` over the ranks."""
        return self._all_reduce(t, dist.ReduceOp.MAX)

    def _all_reduce(self, t: torch.Tensor, op) -> torch.Tensor:
        if not self.active:
            return t
        out = t.detach().to(self.device, copy=True)
        dist.all_reduce(out, op=op)
        return out.to(t.device)

    # -- weights ----------------------------------------------------------------------------

    def shard(self, module: nn.Module, precision: Precision | None = None,
              weights: Path | None = None) -> None:
        """In place, before an optimizer is built on it: onto the world's device, then (under
        torchrun) FSDP2 units on each decoder layer and on the root, under `precision`'s
        mixed-precision policy (trainer_svc.precision; float32 when None), or (fsdp off) the
        same weights on every rank. A module built on the meta device
        (relayrl_torch.models.loading, `meta`: only under torchrun) gets its storage once it
        is sharded, its buffers as it was built with, and its weights from the Hugging Face
        directory `weights` (`read_weights`), so that a rank never holds more of it than its
        own shard."""
        on_meta = is_meta(module)
        assert not on_meta or (self.active and weights is not None), \
            "a module on the meta device is sharded under torchrun, with its weights' directory"
        if not self.active:
            module.to(self.device)
            return
        # to_empty below drops the buffers' values and unties tied parameters
        buffers = dict(module.named_buffers(remove_duplicate=False))
        aliases = tied_aliases(module)
        if not on_meta:
            module.to(self.device)
        if self.fsdp:
            from torch.distributed.fsdp import fully_shard

            policy = (precision or resolve_precision("fp32", self.device)).fsdp_policy()
            for layer in decoder_layers(module):
                fully_shard(layer, mesh=self._device_mesh(), mp_policy=policy)
            fully_shard(module, mesh=self._device_mesh(), mp_policy=policy)
        if on_meta:
            module.to_empty(device=self.device)
            # FSDP2 keeps a tied parameter under its first module, which is its first name
            tie(module, aliases)
            with torch.no_grad():
                for name, value in buffers.items():
                    module.get_buffer(name).copy_(value)
            self.read_weights(module, weights)
        elif not self.fsdp:
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t.data, src=0)

    def read_weights(self, module: nn.Module, directory: Path) -> None:
        """Into `module` (sharded or replicated, with storage), its weights from the
        safetensors files of `directory`, in every rank's own slices: torch.distributed
        .checkpoint's HuggingFaceStorageReader reads each rank's part of each tensor into its
        shard, a tied tensor under its first name. Where the files do not hold every
        parameter under the module's names and shapes (no safetensors; a checkpoint that
        transformers converts as it loads, such as one of separate experts for fused ones),
        rank 0 alone loads the model whole, transformers converting it, and sends each rank
        its part. A persistent buffer the files lack keeps its built value."""
        from torch.distributed.checkpoint import HuggingFaceStorageReader, load

        from relayrl_torch.models.loading import load_model

        state = stored_state(module, directory)
        if self.broadcast(state is not None):  # the ranks' collectives must be the same
            if state is None:
                raise ValueError(f"{directory}: rank {self.world.rank} finds safetensors files "
                                 "other than rank 0's")
            load(state, storage_reader=HuggingFaceStorageReader(str(directory)))
            log.info("rank %d read its part of %d tensors from %s", self.world.rank,
                     len(state), directory)
            return
        if self.world.is_main:
            log.warning("%s: the safetensors files do not name every parameter as the model "
                        "does; rank 0 loads it whole and sends each rank its part", directory)
        whole = load_model(directory).model.state_dict() if self.world.is_main else {}
        dcp = _dcp()
        dcp.set_model_state_dict(module, whole, options=_full_from_rank0(dcp))

    def _device_mesh(self):
        # over the world's own process group, which has trainer.dist_timeout_s (a mesh made
        # by init_device_mesh may make a group of its own, with torch's default timeout)
        if self._mesh is None:
            from torch.distributed.device_mesh import DeviceMesh

            self._mesh = DeviceMesh.from_group(dist.group.WORLD, self.device.type)
        return self._mesh

    def sync_gradients(self, params: list[nn.Parameter]) -> None:
        """After backward: replicated weights average their gradients over the ranks (under
        FSDP2 the reduce-scatter in backward already has)."""
        if not self.active or self.fsdp:
            return
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad)  # gloo has no AVG
            p.grad /= self.world.size

    def full_state_dict(self, module: nn.Module) -> dict[str, torch.Tensor]:
        """The whole module's weights: on rank 0 on the CPU, {} on the others. Every rank
        must call it. In one process, the live tensors."""
        if not self.active:
            return module.state_dict()
        dcp = _dcp()
        return dcp.get_model_state_dict(module, options=_full_to_cpu(dcp))

    def load_full_state_dict(self, module: nn.Module, state: dict[str, torch.Tensor]) -> None:
        """Rank 0's `state` (the whole module's) into every rank's module."""
        if not self.active:
            module.load_state_dict(state)
            return
        dcp = _dcp()
        dcp.set_model_state_dict(module, state, options=_full_from_rank0(dcp))

    def full_optimizer_state(self, modules: nn.Module, optimizer) -> dict:
        """`optimizer`'s state over the parameters of `modules`, whole, on rank 0 (keyed by
        parameter name; {} on the others). In one process, `optimizer.state_dict()`."""
        if not self.active:
            return optimizer.state_dict()
        dcp = _dcp()
        return dcp.get_optimizer_state_dict(modules, optimizer, options=_full_to_cpu(dcp))

    def load_optimizer_state(self, modules: nn.Module, optimizer, state: dict) -> None:
        if not self.active:
            optimizer.load_state_dict(state)
            return
        dcp = _dcp()
        dcp.set_optimizer_state_dict(modules, optimizer, state,
                                     options=_full_from_rank0(dcp))


def _dcp():
    # torch.distributed.checkpoint costs every trainer a second of start-up; one rank never
    # needs it
    from torch.distributed.checkpoint import state_dict

    return state_dict


def _full_to_cpu(dcp):
    return dcp.StateDictOptions(full_state_dict=True, cpu_offload=True)


def _full_from_rank0(dcp):
    return dcp.StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)


def stored_state(module: nn.Module, directory: Path) -> dict[str, torch.Tensor] | None:
    """What of `module`'s state dict the safetensors files of `directory` hold, each under
    its name and shape, or None where they do not hold every parameter so: its tensors but
    tied aliases (read under their first names) and persistent buffers the files lack."""
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    stored = HuggingFaceStorageReader(str(directory)).read_metadata().state_dict_metadata
    buffers = {name for name, _ in module.named_buffers()}
    state = {k: v for k, v in without(module.state_dict(), tied_aliases(module)).items()
             if k in stored or k not in buffers}
    if all(k in stored and tuple(stored[k].size) == tuple(v.shape) for k, v in state.items()):
        return state
    return None


def is_meta(module: nn.Module) -> bool:
    """Whether `module`'s parameters are on the meta device (shapes, no storage)."""
    return any(p.is_meta for p in module.parameters())


def decoder_layers(module: nn.Module) -> list[nn.Module]:
    """The repeated blocks FSDP2 shards one by one: the classes a Hugging Face model names in
    `_no_split_modules`; none for anything else (a value head is sharded whole)."""
    names = set(getattr(module, "_no_split_modules", None) or ())
    return [m for m in module.modules() if type(m).__name__ in names]
