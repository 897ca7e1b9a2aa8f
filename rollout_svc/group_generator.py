"""A worker's groups in the engine: start one from a lease (fresh, or resumed from saved token
and KV state), then extend every unfinished sequence one segment at a time."""

from __future__ import annotations

import logging

import redis

from relayrl.config import ConfigError, RolloutRun
from relayrl.contracts import control
from relayrl.contracts.codec import CodecError
from relayrl.contracts.keys import RunKeys
from relayrl.contracts.leases import LeasedPrompt
from relayrl.contracts.partial import PartialGroup, PartialSequence
from relayrl.contracts.streams import TrajectoryWriter
from relayrl.rules.staleness import must_restart
from relayrl_torch.models.loading import LoadedModel
from rollout_svc.engines.api import Engine, SamplingSpec, fed_routes
from rollout_svc.synthetic_lengths import target_length

log = logging.getLogger(__name__)


class PromptTooLong(ValueError):
    """A prompt longer than the worker's window takes: never cut to fit."""


class GroupGenerator:
    def __init__(self, cfg: RolloutRun, engine: Engine, lm: LoadedModel,
                 writer: TrajectoryWriter):
        self.cfg = cfg
        self.engine = engine
        self.lm = lm
        self.writer = writer  # its Redis connection also serves the live settings
        self.segments = 0
        self.sequences_decoded = 0  # summed over engine calls: over segments, the mean batch
        self.mid_sequence_swaps = 0  # sequences that continued under a newer version
        self.groups_resumed = 0  # leases that came with another worker's token state
        self.kv_imported = 0  # KV states taken over with a moved group (no re-prefill)
        self.kv_refused = 0  # ... that this engine could not use (another version, ...)
        self.groups_restarted_stale = 0  # started over: the trainer could no longer use them
        self.tokens_restarted_stale = 0  # ... the tokens they had, decoded in vain
        self.tokens_reprefilled = 0  # context of moved groups prefilled again (no KV came)
        self.prompt_limit = self._prompt_limit()
        # the run's live settings and the trainer's version, as last read
        self.temperature = cfg.live.temperature
        self.max_staleness = cfg.live.max_staleness
        self.trainer_version = 0

    def _prompt_limit(self) -> int:
        """The longest leased prompt a group can start from: within rollout.max_prompt_tokens
        and leaving the engine's window room for a whole response. The task measured every
        prompt against the configured window (RolloutRun.prompt_window) when it was built; an
        engine that holds less is refused here, so a leased prompt always fits."""
        rc = self.cfg.rollout
        room = self.engine.context_length - rc.max_new_tokens
        if room < 1:
            raise ConfigError(f"rollout.max_new_tokens: {rc.max_new_tokens} leaves no room for a "
                             f"prompt in the engine's window of {self.engine.context_length} "
                             "tokens")
        limit = min(rc.max_prompt_tokens, room)
        window = self.cfg.prompt_window()
        if limit < window.longest:
            raise ConfigError(
                f"rollout.engine: this worker's engine holds {self.engine.context_length} "
                f"tokens, so prompts of at most {limit}, fewer than the {window.longest} the "
                f"task measured its prompts against ({window.describe()}); set "
                f"rollout.engine.max_model_len to {self.engine.context_length}")
        return limit

    def start(self, lease: LeasedPrompt) -> PartialGroup:
        prompt_tokens = self.fit_prompt(lease.prompt_id,
                                        self.lm.encode_problem(lease.text, lease.messages))
        imported = self.kv_imported
        self._import_kv(lease)
        group = self._start_group(lease, prompt_tokens)
        if lease.partial_state and self.kv_imported == imported:
            self.tokens_reprefilled += len(group.prompt_tokens) + sum(
                len(s.tokens) for s in group.sequences if not s.finished)
        return group

    def fit_prompt(self, prompt_id: int, prompt_tokens: list[int]) -> list[int]:
        """`prompt_tokens`, never cut: cut from the front, a prompt loses its chat template's
        opening and trains on what the task never asked. The task measured its prompts
        against this worker's window when it was built (and _prompt_limit checked the
        window), so a longer task prompt breaks an invariant."""
        if len(prompt_tokens) > self.prompt_limit:
            raise PromptTooLong(
                f"prompt {prompt_id}: {len(prompt_tokens)} tokens, more than the "
                f"{self.prompt_limit} this worker's engine takes after rollout.max_new_tokens; "
                "the task measures its prompts against that window when it is built, so the "
                "scheduler and this worker disagree on the window or the tokenizer")
        return prompt_tokens

    def _start_group(self, lease: LeasedPrompt, prompt_tokens: list[int]) -> PartialGroup:
        n = self.cfg.groups.group_size
        if lease.partial_state:
            try:
                group = PartialGroup.decode(lease.partial_state, lease.prompt_id, n)
                self.groups_resumed += 1
                return group
            except CodecError as err:  # the scheduler checked it; start over rather than die
                log.warning("lease %s: saved state unusable (%s); starting over",
                            lease.lease_id, err)
        return PartialGroup.fresh(lease.prompt_id, prompt_tokens, n)

    def _import_kv(self, lease: LeasedPrompt) -> None:
        """Take over the KV states a moved group came with; one the engine cannot use (another
        version, another model, damaged) only costs its re-prefill."""
        for payload in lease.kv_states:
            try:
                self.engine.import_state(self.engine.decode_state(payload))
                self.kv_imported += 1
            except (CodecError, ValueError) as err:
                self.kv_refused += 1
                log.info("lease %s: KV state not used (%s); re-prefilling", lease.lease_id, err)

    def _limit(self, group: PartialGroup, index: int) -> int:
        rc, bench = self.cfg.rollout, self.cfg.bench
        if not bench.synthetic_length_median:
            return rc.max_new_tokens
        return target_length(group.prompt_id, index, bench.synthetic_length_median,
                             bench.synthetic_length_p99_ratio, rc.max_new_tokens)

    def read_live(self) -> None:
        """The run's live settings (relayrl.contracts.control) and the trainer's version, read for
        every segment: the trainer rescores at the temperature the tokens were sampled
        with, and a group it can no longer train is started over (restart_stale)."""
        keys = RunKeys(self.cfg.run_id)
        try:
            pipe = self.writer.r.pipeline(transaction=False)  # one round trip per segment
            stored, version = pipe.hgetall(keys.live_settings).get(keys.trainer_version).execute()
            settings = control.settings_from_hash(stored, self.cfg.live)
            self.temperature, self.max_staleness = settings.temperature, settings.max_staleness
            self.trainer_version = int(version or 0)
        except redis.RedisError as err:
            log.warning("live settings not read (%s); sampling at %s", err, self.temperature)

    def restart_stale(self, groups: list[PartialGroup]) -> None:
        """Start over, under the engine's weights, every group holding a token older than
        the trainer can still train on (its version minus the staleness bound): the trainer
        would drop the whole group, so finishing it is wasted work. Only when the engine's
        version is recent enough itself; until then the worker is catching up."""
        for group in groups:
            if must_restart((min(s.versions) for s in group.sequences if s.versions),
                            self.engine.version, self.trainer_version, self.max_staleness):
                self.tokens_restarted_stale += sum(len(s.tokens) for s in group.sequences)
                group.sequences = [PartialSequence() for _ in group.sequences]
                self.groups_restarted_stale += 1

    def drop(self, groups: list[PartialGroup]) -> None:
        """The groups leave this worker unfinished (handed back, lapsed or abandoned): a
        sequence holds nothing beyond its tokens, so there is nothing to let go."""

    def generate_segment(self, groups: list[PartialGroup]) -> None:
        """Extend every unfinished sequence of `groups` by at most one segment, in one engine
        call under the engine's current weights; every new token is tagged with that
        version. A sequence that passes its length limit is cut there."""
        rc = self.cfg.rollout
        self.read_live()
        self.restart_stale(groups)
        todo = [(g, s, self._limit(g, i)) for g in groups
                for i, s in enumerate(g.sequences) if not s.finished]
        budget = max(limit - len(s.tokens) for _, s, limit in todo)
        if rc.segment_tokens:
            budget = min(budget, rc.segment_tokens)
        spec = SamplingSpec(max_new_tokens=budget, temperature=self.temperature,
                            ignore_eos=bool(self.cfg.bench.synthetic_length_median),
                            keep_state=bool(rc.segment_tokens))
        with self.engine.lock:  # no swap between reading the version and sampling with it
            version = self.engine.version
            outs = self.engine.generate([g.prompt_tokens + s.tokens for g, s, _ in todo], spec)
        for (g, seq, limit), out in zip(todo, outs, strict=True):
            if seq.versions and seq.versions[-1] != version:
                self.mid_sequence_swaps += 1
            keep = limit - len(seq.tokens)
            seq.extend(out.tokens[:keep], out.logprobs[:keep], version,
                       routes=fed_routes(out, len(g.prompt_tokens) + len(seq.tokens), keep))
            if out.finish_reason == "stop" and len(out.tokens) <= keep:
                seq.finish_reason = "stop"
            elif len(seq.tokens) >= limit:
                seq.finish_reason = "length"
        self.segments += 1
        self.sequences_decoded += len(todo)
        self._count_tokens(sum(len(out.tokens) for out in outs))

    def _count_tokens(self, n: int) -> None:
        """Add to this worker's count in Redis, which the trainer turns into a generation
        rate; a throughput figure, so a Redis that refuses it costs only the figure."""
        try:
            self.writer.r.hincrby(RunKeys(self.cfg.run_id).tokens_generated,
                                  self.cfg.rollout.worker_id, n)
        except redis.RedisError as err:
            log.debug("tokens generated not counted: %s", err)
