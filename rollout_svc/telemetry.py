"""What a rollout worker exports on /metrics: its counters, its engine's and its custom-rollout
batcher's, read live at scrape time."""

from __future__ import annotations

from dataclasses import dataclass

from relayrl.runtime.exporter import ServiceMetrics
from relayrl.runtime.stats import Stats, counter, gauge
from rollout_svc.episode_generator import EpisodeGenerator
from rollout_svc.serving.agent_episodes import AgentEpisodes
from rollout_svc.serving.batcher import RequestBatcher
from rollout_svc.serving.chat_turns import TurnMemories
from rollout_svc.worker import RolloutWorker


@dataclass
class RolloutStats(Stats, section="rollout"):
    policy_version: int = gauge("Policy version the engine runs.")
    samples_generated: int = counter("Samples scored and appended.")
    tokens_generated: int = counter(
        "Tokens the engine generated (training rollouts and custom requests).")
    engine_busy_s: float = counter("Seconds the engine spent generating.")
    tokens_per_s: float = gauge("Tokens generated per second of engine time, since the start.")
    tokens_resumed: int = counter(
        "Context tokens resumed from a kept KV cache instead of re-prefilled.")
    segments: int = counter("Engine calls of the training loop.")
    segment_sequences: int = counter(
        "Sequences extended by the training loop's engine calls, summed over calls "
        "(over rollout/segments: the mean batch).")
    seats: int = gauge(
        "Sequences the training loop runs at once at most (max_active_groups x n).")
    loop_s: dict[str, float] = counter(
        "Seconds of the training loop by part: generate, weights, lease, deliver "
        "(including waits for buffer room), save (token state), idle.", label="part")
    mid_sequence_swaps: int = counter(
        "Sequences continued under a newer version than they started with.")
    groups_resumed: int = counter("Leases that came with another worker's token state.")
    groups_restarted_stale: int = counter(
        "Groups started over: a token had aged past the trainer's staleness bound.")
    leases_released: int = counter("Leases handed back unfinished.")
    groups_moved_out: int = counter("Groups handed over by a repack.")
    kv_imported: int = counter("KV states taken over with a moved group.")
    kv_refused: int = counter("KV states of moved groups not usable here.")
    custom_requests: int = counter("Custom-rollout requests (gRPC, HTTP).")
    custom_engine_calls: int = counter("Engine calls that served custom-rollout requests.")
    chat_turns_evicted: int = counter(
        "Assistant turns the OpenAI-compatible server forgot for an agent's quota "
        "(rollout.turn_memory_per_agent); a conversation sent back with one is rendered whole.")
    scheduler_call_failures: int = counter(
        "Scheduler calls that failed or passed their deadline.")
    buffer_waiting: int = gauge(
        "1 while a delivery waits for room in the buffer (buffer.max_pending_samples).")
    buffer_full_waits: int = counter("Times a delivery found the buffer full and backed off.")
    buffer_full_wait_s: float = counter("Seconds deliveries waited for room.")
    redis_oom_refusals: int = counter(
        "Appends Redis refused at its memory limit (retried, never dropped).")
    redis_oom_wait_s: float = counter(
        "Seconds appends waited for Redis to accept writes again.")


@dataclass
class PullStats(Stats, section="weights"):
    swaps: int = counter("Versions pulled and loaded into the engine.")
    pull_failures: int = counter("Weight refreshes a relay failed.")
    signatures_refused: int = counter(
        "Versions refused because their manifest is not signed by the trainer's key.")
    bytes_pulled: int = counter("Bytes of weights pulled: a delta's, or the whole version's.")
    deltas_applied: int = counter("Versions pulled as the changes since the one held.")
    deltas_refused: int = counter(
        "Deltas refused (they did not fit or verify); each version then pulled whole.")
    pull_s: float = gauge("Seconds the last pull-and-load took.")


@dataclass
class EpisodeStats(Stats, section="env"):
    """A worker with rollout.environment: its episodes (none reported without one)."""

    episodes: int | None = counter("Episodes opened, one per sample.")
    turns: int | None = counter("Model turns played in episodes.")
    errors: int | None = counter(
        "Episodes ended by an environment error: a constructor, reset or step that raised, "
        "returned too much or too late, or passed the episode's budget (the sample scores 0).")
    errors_by_kind: dict[str, int] | None = counter(
        "Environment errors by kind (relayrl_tasks/episodes/play.py: raised, invalid, "
        "max_observation_chars, max_env_tokens, reset_timeout_s, step_timeout_s, "
        "max_stuck_calls).", label="kind")
    tool_calls: int | None = counter(
        "Tool calls the model made in episodes of a ToolEnvironment.")
    tool_errors: dict[str, int] | None = counter(
        "Tool calls answered with an error, by kind (relayrl/plugins/envs/tools.py: "
        "malformed, unknown_tool, bad_arguments, raised, tool_timeout_s, max_result_chars, "
        "max_calls_per_turn, max_stuck_tools); the episode goes on.", label="kind")
    stuck_calls: int | None = gauge(
        "Environment calls abandoned at their deadline and still running (each holds a "
        "thread; rollout.environment.max_stuck_calls at most).")


@dataclass
class AgentEpisodeStats(Stats, section="agents"):
    """Episodes agents tagged on the OpenAI-compatible server (rollout_svc.serving.
    agent_episodes); none reported where the worker serves no HTTP."""

    episodes: int | None = counter("Agent episodes opened.")
    turns: int | None = counter("Turns recorded in agent episodes.")
    rewarded: int | None = counter("Agent episodes rewarded.")
    held: int | None = gauge("Agent episodes held: played, or rewarded and waiting for their "
                             "group.")
    groups_submitted: int | None = counter("Groups of agent episodes the buffer took.")
    episodes_submitted: int | None = counter("Agent episodes in those groups.")
    submit_failures: int | None = counter(
        "Submissions the buffer did not take (kept and retried under their request id).")
    dropped: dict[str, int] | None = counter(
        "Agent episodes dropped at a deadline, by reason: idle (rollout.agent_episodes."
        "idle_s), group_incomplete and not_submitted (group_wait_s).", label="reason")
    refused: dict[str, int] | None = counter(
        "Episode requests refused, by the field named: episode, task, messages, reward.",
        label="field")


def agent_episode_stats(episodes: AgentEpisodes | None) -> AgentEpisodeStats:
    if episodes is None:
        return AgentEpisodeStats(None, None, None, None, None, None, None, None, None)
    e = episodes
    return AgentEpisodeStats(episodes=e.opened, turns=e.turns, rewarded=e.rewarded,
                             held=e.held(), groups_submitted=e.groups_submitted,
                             episodes_submitted=e.episodes_submitted,
                             submit_failures=e.submit_failures, dropped=dict(e.dropped),
                             refused=dict(e.refused))


def episode_stats(worker: RolloutWorker) -> EpisodeStats:
    gen = worker.generator
    if not isinstance(gen, EpisodeGenerator):
        return EpisodeStats(None, None, None, None, None, None, None)
    return EpisodeStats(episodes=gen.episodes, turns=gen.turns, errors=gen.env_errors,
                        errors_by_kind=dict(gen.env_error_kinds), tool_calls=gen.tool_calls,
                        tool_errors=dict(gen.tool_error_kinds), stuck_calls=gen.calls.stuck)


def rollout_metrics(worker: RolloutWorker, batcher: RequestBatcher,
                    turns: TurnMemories | None = None,
                    episodes: AgentEpisodes | None = None) -> ServiceMetrics:
    """`turns` and `episodes`: the OpenAI-compatible server's, where the worker serves one."""
    def read() -> tuple[RolloutStats, PullStats, EpisodeStats, AgentEpisodeStats]:
        w = worker
        pressure = w.writer.counters
        engine = w.engine.stats()
        tokens, busy = engine.get("tokens_generated", 0), engine.get("busy_s", 0)
        # the counters live in the worker's parts (RolloutWorker)
        rollout = RolloutStats.from_attributes(
            w.boundary, w.generator, w, policy_version=w.engine.version,
            tokens_generated=tokens, engine_busy_s=busy,
            tokens_per_s=tokens / busy if busy else 0.0,
            tokens_resumed=engine.get("tokens_resumed", 0),
            segment_sequences=w.generator.sequences_decoded, loop_s=dict(w.loop.seconds),
            custom_requests=batcher.requests, custom_engine_calls=batcher.batches,
            chat_turns_evicted=turns.evicted if turns else 0,
            buffer_waiting=int(w.writer.waiting_for_room),
            buffer_full_waits=pressure.full_waits, buffer_full_wait_s=pressure.full_wait_s,
            redis_oom_refusals=pressure.oom_refusals, redis_oom_wait_s=pressure.oom_wait_s)
        pulls = PullStats.from_attributes(w.weights, swaps=w.weights.weight_swaps,
                                          pull_s=w.weights.last_pull_s)
        return rollout, pulls, episode_stats(w), agent_episode_stats(episodes)

    return ServiceMetrics((RolloutStats, PullStats, EpisodeStats, AgentEpisodeStats), read,
                          {"service": "rollout", "worker_id": worker.worker_id})
