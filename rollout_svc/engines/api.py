"""The engine interface every generation backend implements.

An engine turns contexts into completions under the weights it currently holds. A context is
a prompt plus whatever was already generated for it, so continuing a sequence after a weight
swap (a partial rollout's next segment) is just another call: the engine re-prefills it under
the new version. The caller tags each token with the version the engine held.

An engine may also keep sequences' KV states (the torch engine does, when asked to): a
continuation whose context extends a state it holds resumes from it instead of re-prefilling,
and a state can be exported to move a sequence to another worker with its cache. The default
keeps none: `export_state` gives None and `import_state` refuses, so a sequence migrates by its
tokens and the destination re-prefills them. The vLLM engine with KV transfer configured
exports a ticket instead of the tensors: vLLM keeps the blocks and the next engine pulls them
over NIXL (rollout_svc.engines.vllm_kv). Either way the tokens are the sequence; a state is
only a shortcut that is refused (ValueError) when it does not fit the importing engine's model
or version. A state travels in its own wire form: `.encode()`, and the engine's `decode_state`.
"""

from __future__ import annotations

import json
import math
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch

from relayrl.config.rollout import MAX_SEED, MAX_TEMPERATURE, MIN_TEMPERATURE
from relayrl_torch.sampling.kv_state import SequenceKV
from relayrl_torch.sampling.sampler import Completion
from rollout_svc.engines import stop_strings

MAX_TOP_LOGPROBS = 20  # as OpenAI bounds top_logprobs

__all__ = ["Completion", "Engine", "SamplingSpec", "fed_routes"]


@dataclass(frozen=True)
class SamplingSpec:
    max_new_tokens: int
    temperature: float = 1.0
    greedy: bool = False
    seed: int | None = None  # per-call seed; None continues the engine's own stream
    ignore_eos: bool = False  # generate max_new_tokens whatever is sampled (benchmarks)
    # the caller will continue these sequences (next segment, next stream chunk): an engine
    # with a KV cache keeps their states; cutting them out costs ~10% of a call otherwise
    keep_state: bool = False
    # ... and continues the sequences that stopped too (an episode's next turn extends the
    # reply with the environment's tokens): kept as well, so the turn is not re-prefilled
    keep_stopped: bool = False
    # strings that end a sequence, matched on its decoded text (rollout_svc.engines.
    # stop_strings): the token completing one is its last, finish_reason "stop"
    stop: tuple[str, ...] = ()
    top_logprobs: int = 0  # each position's this many most likely tokens, too (0..20)
    # constrained output, as the JSON of vLLM's StructuredOutputsParams fields: {"json":
    # schema} or {"json_object": true}; only the vLLM engine honours it ("": none)
    structured: str = ""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: must be >= 1, got {self.max_new_tokens}")
        # every caller checked its own input against these: the engine's last line of defence
        if not (math.isfinite(self.temperature)
                and MIN_TEMPERATURE <= self.temperature <= MAX_TEMPERATURE):
            raise ValueError(f"temperature: must be in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}], "
                             f"got {self.temperature}")
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"seed: must be in 0..{MAX_SEED}, got {self.seed}")
        if not isinstance(self.stop, tuple):
            raise ValueError(f"stop: must be a tuple of strings, got {self.stop!r}")
        stop_strings.check(self.stop)
        if self.structured:
            structured_kind(self.structured)
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs: must be in 0..{MAX_TOP_LOGPROBS}, got "
                             f"{self.top_logprobs}")


def fed_routes(out: Completion, context: int, keep: int) -> np.ndarray | None:
    """`out`'s routes (Completion.routes) for a sequence of its `context` tokens and its
    first `keep` tokens: every position but the last kept token's; None when not recorded."""
    if out.routes is None:
        return None
    return out.routes[:, :context + min(keep, len(out.tokens)) - 1]


def structured_kind(structured: str) -> str:
    """The response_format a SamplingSpec's `structured` stands for (json_schema or
    json_object); ValueError for anything else."""
    try:
        value = json.loads(structured)
    except ValueError:
        value = None
    if isinstance(value, dict) and len(value) == 1:
        if value.get("json_object") is True:
            return "json_object"
        if isinstance(value.get("json"), dict):
            return "json_schema"
    raise ValueError(f"structured: must be the JSON of {{\"json\": schema}} or "
                     f"{{\"json_object\": true}}, got {structured[:80]!r}")


class Engine(ABC):
    """Implementations serialise their own calls: the worker loop and the custom-rollout
    APIs share one engine from several threads."""

    name: str = "engine"
    # most tokens (context + generated) one sequence may hold: the model's context length
    context_length: int = 1 << 30

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.threads = torch.get_num_threads()

    def use_threads(self) -> None:
        """Compute with the intra-op thread count the engine was built with, from whichever
        thread calls (gRPC handlers, the request batcher): torch's count is per thread, and
        vLLM's CPU attention refuses to run with another count than it planned for."""
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)

    @property
    @abstractmethod
    def version(self) -> int:
        """The policy version the engine currently runs."""

    @abstractmethod
    def generate(self, contexts: list[list[int]], spec: SamplingSpec) -> list[Completion]:
        """One completion per context. Log-probabilities are those of the distribution the
        token was sampled from (after temperature). finish_reason is "stop" when the
        end-of-sequence token was produced (it is included) or a stop string of the spec's
        was completed (the token completing it is the last; stop_reason names it), and
        "length" when the budget ran out. With spec.top_logprobs each position's most likely
        tokens come too."""

    @abstractmethod
    def load_weights(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        """Swap in a whole, verified version; never leaves a half-loaded model behind: every
        name, shape and dtype is checked before the first byte changes."""

    def export_state(self, context: list[int]) -> SequenceKV | None:
        """The KV state this engine holds for `context` (covering all of it or all but its
        last token), or None."""
        return None

    def decode_state(self, payload: bytes) -> SequenceKV:
        """A state in the wire form this engine's kind exports (CodecError otherwise)."""
        return SequenceKV.decode(payload)

    def import_state(self, state: SequenceKV) -> None:
        """Keep `state` so that a context extending its tokens resumes from it; ValueError
        when refused, which leaves the engine as it was."""
        raise ValueError(f"kv state: the {self.name} engine keeps none; continue from tokens")

    def stats(self) -> dict[str, float]:
        return {}
