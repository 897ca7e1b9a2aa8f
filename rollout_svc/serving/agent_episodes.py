"""Episodes an agent plays through the OpenAI-compatible server, recorded by the server: the
agent tags its chat requests with an episode and, once it is done, reports one reward; the
server keeps each turn as the tokens the model wrote, groups the rewarded episodes of one task
and submits each group for training exactly once. An agent written with a framework that
keeps no token ids trains unchanged but for its base_url, api key and the tag.

    episodes = AgentEpisodes(group_size=8, limits=cfg.rollout.agent_episodes,
                             reward_range=(0.0, 1.0), submit=submitter)
    episodes.check(owner, "ep-1", prompt_ids)        # before a turn is generated
    episodes.record(owner, "ep-1", task, turn)       # the turn as the server returned it
    episodes.reward(owner, "ep-1", 1.0)              # "waiting" or "submitted"
    episodes.sweep()                                 # deadlines, and submissions to retry

The rules:
- An episode is one training sequence: its first turn's prompt, then every completion (the
  policy's tokens, trained) and the tokens between a completion and the next turn's prompt
  (tool results and the chat template's, masked from the loss), as
  relayrl.plugins.buffer_client.TurnSequence lays them out, each token held once. A turn
  whose prompt does not extend the episode's tokens exactly (an agent that edited its
  history, or a turn the server no longer remembers) is refused before anything is
  generated, never merged: the agent goes on in a new episode.
- Its task is the request's X-RelayRL-Task, else its first turn's prompt (episodes that
  start from the same prompt are one task). buffer.group_size rewarded episodes of one task,
  from one credential, make a group, submitted once under a request id made from their
  episode ids, so a submission retried after a lost reply is taken once.
- Each credential holds at most `max_open` episodes, each at most `max_turns` turns. An
  episode idle for `idle_s` (no turn, no reward) is dropped; so is a rewarded one whose group
  is not complete `group_wait_s` after its reward, and a group the buffer has not taken by
  then. Every drop is counted by reason; nothing else is lost.
- Episode ids belong to the credential that opened them: another credential's id reads as
  unknown.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc

from relayrl.config.rollout import AgentEpisodesConfig
from relayrl.contracts.proto.v1 import buffer_pb2, buffer_pb2_grpc
from relayrl.plugins.buffer_client import RETRIED, ChatTurn, TurnSequence, submit_group
from relayrl.runtime.grpc_util import channel
from relayrl.runtime.outage import is_too_large

log = logging.getLogger(__name__)
NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")  # an episode id or a task tag
DROP_REASONS = ("idle", "group_incomplete", "not_submitted", "stale", "refused")

Submit = Callable[[str, list[buffer_pb2.Trajectory]], None]  # (request id, one group)


class NotTaken(Exception):
    """The buffer refused a group for good: `reason` "stale" (its tokens are older than the
    trainer still takes) or "refused" (anything else it will refuse again)."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


class EpisodeRefused(ValueError):
    """A request the episodes refuse: `status` the HTTP status, the message names the field,
    the value and the limit."""

    def __init__(self, status: int, field: str, message: str):
        super().__init__(message)
        self.status, self.field = status, field


@dataclass
class _Episode:
    owner: str
    episode_id: str
    task: str
    touched: float  # when it last took a turn or its reward
    seq: TurnSequence = field(default_factory=TurnSequence)  # its turns, each token once
    finish_reason: str = "stop"  # of its last turn
    reward: float | None = None


@dataclass
class _Group:
    request_id: str
    episodes: list[_Episode]
    since: float  # when it was complete


def buffer_submitter(address: str, worker_id: str, timeout_s: float = 30.0) -> Submit:
    """Groups to Buffer.Submit at `address` under the process's credentials (the service
    token carries the agent role Submit asks for), a few tries each; what still fails is
    kept and retried at the next sweep under the same request id."""
    stub = buffer_pb2_grpc.BufferStub(channel(address))

    def submit(request_id: str, trajectories: list[buffer_pb2.Trajectory]) -> None:
        try:
            submit_group(stub, trajectories, source=f"agent-episodes:{worker_id}",
                         timeout_s=timeout_s, attempts=3, request_id=request_id)
        except grpc.RpcError as err:
            if err.code() in RETRIED and not is_too_large(err):
                raise
            stale = err.code() == grpc.StatusCode.FAILED_PRECONDITION
            raise NotTaken("stale" if stale else "refused", err.details() or "") from None

    return submit


def check_name(value: str, what: str) -> str:
    if not isinstance(value, str) or not NAME.match(value):
        raise EpisodeRefused(400, what, f"{what}: {value!r} must be 1 to 128 characters of "
                             "letters, digits and _.:-")
    return value


def task_of_prompt(prompt_ids: Sequence[int]) -> str:
    """The task of an untagged episode: its first prompt."""
    return "prompt:" + hashlib.sha256(",".join(map(str, prompt_ids)).encode()).hexdigest()[:32]


class AgentEpisodes:
    """Every credential's episodes, behind one lock; `submit` is called outside it."""

    def __init__(self, group_size: int, limits: AgentEpisodesConfig,
                 reward_range: tuple[float, float], submit: Submit,
                 clock: Callable[[], float] = time.monotonic):
        self.group_size = group_size
        self.limits = limits
        self.reward_range = reward_range
        self.submit = submit
        self.clock = clock
        self._episodes: dict[tuple[str, str], _Episode] = {}
        self._waiting: dict[tuple[str, str], list[_Episode]] = {}  # (owner, task): rewarded
        self._unsent: list[_Group] = []  # complete groups the buffer has not taken yet
        self._held: Counter[str] = Counter()  # episodes each credential holds
        self._lock = threading.RLock()  # refusals are counted under it, inside or out
        self.opened = 0
        self.turns = 0
        self.rewarded = 0
        self.groups_submitted = 0
        self.episodes_submitted = 0
        self.submit_failures = 0  # attempts the buffer did not take (retried at sweep)
        self.dropped: Counter[str] = Counter()  # episodes, by DROP_REASONS
        self.refused: Counter[str] = Counter()  # requests, by field

    def _refuse(self, status: int, what: str, message: str) -> EpisodeRefused:
        with self._lock:
            self.refused[what] += 1
        return EpisodeRefused(status, what, message)

    def _name(self, value: str, what: str) -> str:
        try:
            return check_name(value, what)
        except EpisodeRefused:
            with self._lock:
                self.refused[what] += 1
            raise

    def _forget(self, e: _Episode) -> None:
        del self._episodes[(e.owner, e.episode_id)]
        self._held[e.owner] -= 1
        if not self._held[e.owner]:
            del self._held[e.owner]

    def check(self, owner: str, episode_id: str, prompt_ids: Sequence[int],
              task: str | None = None) -> None:
        """Refuse a turn before it is generated: a malformed episode id or task tag, past the
        credential's quota of episodes, past the episode's turns, or a prompt that does not
        extend the episode's tokens."""
        self._name(episode_id, "episode")
        if task is not None:
            self._name(task, "task")
        with self._lock:
            e = self._episodes.get((owner, episode_id))
            if e is None:
                if self._held[owner] >= self.limits.max_open:
                    raise self._refuse(429, "episode", (
                        f"episode {episode_id!r}: this credential holds "
                        f"{self.limits.max_open} episodes already "
                        "(rollout.agent_episodes.max_open); reward or finish some first"))
                return
            if e.reward is not None:
                raise self._refuse(409, "episode", f"episode {episode_id!r}: already "
                                   "rewarded; a new turn needs a new episode")
            if e.seq.turns >= self.limits.max_turns:
                raise self._refuse(409, "episode", (
                    f"episode {episode_id!r}: {e.seq.turns} turns, the most one episode takes "
                    f"(rollout.agent_episodes.max_turns {self.limits.max_turns}); reward it"))
            if not e.seq.extends(prompt_ids):
                raise self._refuse(409, "messages", (
                    f"episode {episode_id!r}: this turn's conversation does not extend the "
                    f"episode's {e.seq.turns} turns as the model wrote them (a message was "
                    "changed, or a turn is no longer remembered); go on in a new episode"))

    def record(self, owner: str, episode_id: str, task: str | None, turn: ChatTurn,
               finish_reason: str) -> None:
        """Add a turn the server returned (checked by `check` before it was generated)."""
        now = self.clock()
        with self._lock:
            e = self._episodes.get((owner, episode_id))
            if e is None:
                e = _Episode(owner, episode_id, task or task_of_prompt(turn.prompt_token_ids),
                             now)
                self._episodes[(owner, episode_id)] = e
                self._held[owner] += 1
                self.opened += 1
            elif e.reward is not None or not e.seq.extends(turn.prompt_token_ids):
                return  # a concurrent turn of the same episode got there first: not merged
            e.seq.add(turn)
            e.finish_reason, e.touched = finish_reason, now
            self.turns += 1

    def reward(self, owner: str, episode_id: str, value: float) -> str:
        """The episode's reward: "waiting" for the rest of its group; when it completes the
        group, "submitted" (the buffer took it), "queued" (to be retried) or "stale" /
        "refused" (the buffer refused it for good: dropped, counted)."""
        self._name(episode_id, "episode")
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            raise self._refuse(400, "reward", f"reward: {value!r} must be a finite number")
        low, high = self.reward_range
        if not low <= value <= high:
            raise self._refuse(400, "reward", f"reward: {value!r} is outside the task's "
                               f"reward range [{low:g}, {high:g}] (task.reward_range)")
        with self._lock:
            e = self._episodes.get((owner, episode_id))
            if e is None:
                raise self._refuse(404, "episode", f"episode {episode_id!r}: no open episode "
                                   "of this credential (never played, dropped, or submitted)")
            if e.reward is not None:
                raise self._refuse(409, "episode", f"episode {episode_id!r}: already rewarded "
                                   f"({e.reward:g})")
            e.reward, e.touched = float(value), self.clock()
            self.rewarded += 1
            waiting = self._waiting.setdefault((owner, e.task), [])
            waiting.append(e)
            if len(waiting) < self.group_size:
                return "waiting"
            del self._waiting[(owner, e.task)]
            for m in waiting:
                self._forget(m)
            ids = "\n".join(sorted(m.episode_id for m in waiting))
            group = _Group(hashlib.sha256(f"{owner}\n{ids}".encode()).hexdigest()[:32],
                           waiting, self.clock())
        return self._send(group)

    def _send(self, group: _Group) -> str:
        """Submit a complete group: "submitted", "queued" (to retry at sweep), or the reason
        the buffer refused it for good, its episodes dropped."""
        trajectories = [e.seq.trajectory(e.reward, e.finish_reason) for e in group.episodes]
        try:
            self.submit(group.request_id, trajectories)
        except NotTaken as err:
            log.warning("group %s of %d agent episodes refused by the buffer (%s): %s",
                        group.request_id, len(group.episodes), err.reason, err)
            with self._lock:
                self.dropped[err.reason] += len(group.episodes)
            return err.reason
        except Exception as err:  # the buffer or the network: kept, retried at sweep
            log.warning("group %s of %d agent episodes not taken yet: %s", group.request_id,
                        len(group.episodes), err)
            with self._lock:
                self.submit_failures += 1
                self._unsent.append(group)
            return "queued"
        with self._lock:
            self.groups_submitted += 1
            self.episodes_submitted += len(group.episodes)
        return "submitted"

    def sweep(self) -> None:
        """Drop what passed its deadline (module docstring) and retry the unsent groups."""
        now, lim = self.clock(), self.limits
        with self._lock:
            for e in list(self._episodes.values()):
                if e.reward is None and now - e.touched > lim.idle_s:
                    self._forget(e)
                    self.dropped["idle"] += 1
                elif e.reward is not None and now - e.touched > lim.group_wait_s:
                    self._forget(e)
                    self._waiting[(e.owner, e.task)].remove(e)
                    self.dropped["group_incomplete"] += 1
            self._waiting = {k: v for k, v in self._waiting.items() if v}
            retry, self._unsent = self._unsent, []
            for g in [g for g in retry if now - g.since > lim.group_wait_s]:
                retry.remove(g)
                self.dropped["not_submitted"] += len(g.episodes)
        for g in retry:
            self._send(g)

    def run_sweeps(self, stop: threading.Event, every_s: float = 5.0) -> None:
        while not stop.wait(every_s):
            self.sweep()

    def held(self, owner: str | None = None) -> int:
        """Episodes held, by one credential or by all."""
        with self._lock:
            return len(self._episodes) if owner is None else self._held[owner]
