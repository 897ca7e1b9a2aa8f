"""The separate evaluator (eval.mode separate): a process that follows the relay, so that
evaluation never stalls training.

    python -m eval_svc --config runs/tiny/config.yaml   # `relayrl up` starts it

It holds the model on eval.device and evaluates the model it starts from as version 0, then
polls the relay every eval.poll_s for the versions it holds, pulls the newest one that is due
(a multiple of eval.every, or trainer.max_steps) and not yet evaluated, loads it and
evaluates every eval set. A due version the relay dropped while an eval ran is skipped: the
evaluator follows the newest, it never queues behind training. Records go to
<run_dir>/eval.jsonl (the trainer alone writes metrics.jsonl), with TensorBoard and W&B as the
trainer's; a restarted evaluator goes on after the last version in eval.jsonl. It exits once
trainer.max_steps is evaluated.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import TYPE_CHECKING

import grpc

from relayrl.config import EvalRun
from relayrl.runtime.metrics import MetricsWriter, StepRecord, open_run_metrics, read_records
from relayrl_torch.devices import resolve_device
from relayrl_torch.evaluation.runner import evaluate_sets
from relayrl_torch.evaluation.sets import build_sets
from relayrl_torch.models.loading import LoadedModel
from relayrl_torch.models.lora import is_lora, load_adapter, with_lora
from relayrl_torch.sampling.sampler import Stopped
from relayrl_torch.weights.client import RelayClient
from relayrl_torch.weights.collective import worker_device
from relayrl_torch.weights.manifest import WeightError
from relayrl_torch.weights.signing import ManifestKeys
from relayrl_torch.weights.tied import load_published

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)
EVAL_FILE = "eval.jsonl"


def is_due(version: int, every: int, max_steps: int) -> bool:
    return every > 0 and (version >= max_steps or version % every == 0)


class Follower:
    def __init__(self, cfg: EvalRun, lm: LoadedModel, relays: list[RelayClient],
                 writer: MetricsWriter):
        self.cfg = cfg
        self.lm = lm
        self.relays = relays
        self.writer = writer
        self.sets = build_sets(cfg)  # a bad set fails here, before any pull
        done = [r.step for r in read_records(writer.path)]
        self.last = max(done) if done else -1  # the newest version evaluated

    def evaluate(self, version: int, stop: threading.Event | None = None) -> StepRecord:
        """The version's record, written; relayrl_torch.sampling.sampler.Stopped (nothing
        written) once `stop` is set."""
        t0 = time.monotonic()
        figures, _ = evaluate_sets(self.lm, self.sets, seed=self.cfg.eval.seed,
                                   batch_size=self.cfg.eval.batch_size, stop=stop)
        record = StepRecord.from_json({"step": version, **figures})
        record.figures.eval_s = time.monotonic() - t0
        self.writer.write(record)
        self.last = version
        log.info("version %d: %s", version, ", ".join(
            f"{k}={v:.3f}" for k, v in figures.items() if k.endswith("pass@1")))
        return record

    def next_due(self) -> tuple[RelayClient, int] | None:
        """The newest due version above the last evaluated one any relay holds."""
        for relay in self.relays:
            try:
                held = relay.versions()
            except grpc.RpcError as err:
                log.debug("relay %s: %s", relay.address, err)
                continue
            due = [v for v in held if v > self.last and is_due(v, self.cfg.eval.every,
                                                                self.cfg.follows.max_steps)]
            if due:
                return relay, max(due)
        return None

    def step(self, stop: threading.Event | None = None) -> bool:
        """One look at the relay; True if a version was evaluated."""
        found = self.next_due()
        if found is None:
            return False
        relay, version = found
        try:
            tensors = relay.pull(version)
        except (WeightError, grpc.RpcError) as err:  # dropped meanwhile: the next look
            log.warning("pull of version %d from %s failed: %s", version, relay.address, err)
            return False
        if is_lora(self.lm.model):
            load_adapter(self.lm.model, tensors, version)
        else:
            load_published(self.lm.model, tensors)
        self.evaluate(version, stop)
        return True

    @property
    def finished(self) -> bool:
        return self.last >= self.cfg.follows.max_steps

    def run(self, stop: threading.Event) -> None:
        try:
            if self.last < 0 and self.cfg.eval.at_start:  # the starting model: version 0
                self.evaluate(0, stop)
            while not stop.is_set() and not self.finished:
                if not self.step(stop):
                    stop.wait(self.cfg.eval.poll_s)
        except Stopped:  # the version is evaluated again by the next evaluator
            log.info("stopped during an evaluation; nothing of it written")


def devices(cfg: EvalRun) -> tuple[torch.device, torch.device | None]:
    """(where the evaluator holds its model and decodes, where it receives versions over the
    nccl weight plane or None on the host planes): eval.device, resolved once at start-up
    (relayrl_torch.devices), before the model loads, so a GPU that is not there stops it at
    once."""
    return (resolve_device(cfg.eval.device, "eval.device"),
            worker_device(cfg.pull_plane, cfg.eval.device, "eval.device"))


def evaluated_model(cfg: EvalRun, device: torch.device) -> LoadedModel:
    """The run's model as the evaluator holds it: in model.dtype, the dtype versions ship in;
    with trainer.lora wrapped in the trainer's adapter settings (versions are the adapter);
    on `device`."""
    from relayrl_torch.models import resolve_model_path
    from relayrl_torch.models.loading import load_model

    lm = load_model(resolve_model_path(cfg.model, cfg.task), cfg.model.dtype_name())
    if cfg.follows.lora is not None:
        lm.model = with_lora(lm.model, cfg.follows.lora)
    lm.model.to(device)
    return lm


def serve(cfg: EvalRun) -> None:
    import torch

    from relayrl.runtime.logs import setup_logging

    setup_logging("evaluator")
    torch.set_num_threads(cfg.torch_threads)
    device, weight_device = devices(cfg)
    lm = evaluated_model(cfg, device)
    log.info("evaluator on %s", device)
    keys = ManifestKeys(verifier=ManifestKeys.from_config(cfg.auth).verifier)
    link = cfg.relays
    relays = [RelayClient(a, link.chunk_bytes, link.timeout_s, cfg.pull_plane, weight_device,
                          keys=keys) for a in link.addresses]
    writer = open_run_metrics(cfg, EVAL_FILE, job_type="eval")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        Follower(cfg, lm, relays, writer).run(stop)
    finally:
        writer.close()
        for relay in relays:
            relay.close()
