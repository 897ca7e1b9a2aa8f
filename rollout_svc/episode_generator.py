"""A worker's groups as multi-turn episodes: one engine call per segment, over every episode
whose turn it is.

With rollout.environment set, the worker's GroupGenerator is this one. `start` opens one
episode per sample (a fresh environment instance, `reset` with the problem); each
`generate_segment` runs one turn of every episode that is not waiting for its environment in
a single engine call, then starts each episode's environment step on the model's reply, on
a thread. A step that answers within STEP_GRACE_S is taken in the same segment; a slower one
(a tool behind a network) is answered at the first segment after it returns, and its episode
waits alone: the worker's other episodes take their turns meanwhile, new groups join, and the
worker moves to newer weights between segments. Were every turn to wait for all steps, each
turn would cost the slowest tool call among the worker's episodes, and a heavy tail would set
the pace of the whole worker. The answer's observation is appended, inside the template's
glue, as environment tokens (rollout_svc/episodes.py, relayrl_tasks/episodes/turns.py).
Turns of one episode may run under different weights: every token keeps its own version.

An episode ends when the environment says done (or gives no observation), after
rollout.environment.max_turns model turns, when the model's tokens over all its turns reach
rollout.max_new_tokens (finish "length", the reply cut, no step), or when the next turn would
not fit the model's context, or with an error: the environment raised, returned too much,
ran past its time limit or the episode's environment-token budget (rollout.environment's
bounds; relayrl_tasks/episodes/play.py lists the errors). The environment calls of a group's
resets, and of a turn's steps, run at once on threads, each with its deadline
(relayrl/plugins/envs/calls.py): a slow call holds the worker for one deadline at most,
ends its own episode, and the others go on. Each error is logged and counted per kind.
tests/unit/test_episodes.py runs it on the tiny model.
"""

from __future__ import annotations

import logging
from collections import Counter

from relayrl.config import RolloutRun
from relayrl.contracts.leases import LeasedPrompt
from relayrl.contracts.streams import TrajectoryWriter
from relayrl.plugins.envs.calls import EnvCalls
from relayrl.plugins.envs.tools import ToolEnvironment, check_deadlines, declared_tools
from relayrl.plugins.tasks.problem import Problem
from relayrl.rules.staleness import must_restart
from relayrl_tasks.envs import load_environment, make_environment
from relayrl_tasks.episodes.play import (
    Move,
    Turn,
    answer,
    error_kind,
    failure,
    goes_on,
    open_episodes,
    start_step,
)
from relayrl_tasks.episodes.turns import TurnGlue
from relayrl_torch.models.loading import LoadedModel
from rollout_svc.engines.api import Engine, SamplingSpec, fed_routes
from rollout_svc.episodes import Episode, EpisodeGroup, PendingStep
from rollout_svc.group_generator import GroupGenerator

log = logging.getLogger(__name__)

# Seconds a segment waits for the steps it started: a quick environment's answer is taken at
# once, as if stepping were part of the turn; a slower one is taken at a later segment.
STEP_GRACE_S = 0.5
# Seconds a segment with no episode ready waits for a step to answer, before the worker
# looks for new prompts and newer weights again.
IDLE_WAIT_S = 0.1


class EpisodeGenerator(GroupGenerator):
    def __init__(self, cfg: RolloutRun, engine: Engine, lm: LoadedModel,
                 writer: TrajectoryWriter):
        super().__init__(cfg, engine, lm, writer)
        env = cfg.rollout.environment
        assert env is not None
        self.env_cfg = env
        self.env_cls = load_environment(env.cls)
        # wrong options fail at start-up
        check_deadlines(make_environment(self.env_cls, env.options), env.step_timeout_s)
        self.glue = TurnGlue(lm.tokenizer, lm.eos_ids, declared_tools(self.env_cls))
        self.glue.check()
        self.episodes = 0
        self.turns = 0
        self.env_errors = 0
        self.env_error_kinds: Counter[str] = Counter()  # by kind (play.KINDS)
        self.tool_calls = 0
        self.tool_error_kinds: Counter[str] = Counter()  # by kind (tools.TOOL_ERROR_KINDS)
        self.calls = EnvCalls(env.max_stuck_calls)

    def start(self, lease: LeasedPrompt) -> EpisodeGroup:
        problem = Problem(lease.prompt_id, lease.text, lease.reference, lease.messages,
                          lease.metadata)
        n = self.cfg.groups.group_size
        openings = open_episodes(self.env_cls, self.env_cfg, [problem] * n, self.glue,
                                 self.lm.encode_problem, self.calls)
        self.episodes += n
        episodes = []
        for env, messages, tokens, error in openings:
            if not error and len(tokens) > self.prompt_limit:
                # never cut: the episode opens with the task's prompt, scored 0 with the error
                error = failure(f"{self.env_cls.__name__}.reset", "prompt_window",
                                f"its opening is {len(tokens)} tokens, over the "
                                f"{self.prompt_limit} this worker's engine takes after "
                                "rollout.max_new_tokens")
                env = None
                messages = ([dict(m) for m in problem.messages]
                            or [{"role": "user", "content": problem.text}])
                tokens = self.lm.encode_problem(problem.text, problem.messages)
            if error:
                self._failed(lease, error)
            episodes.append(Episode(env, messages, self.fit_prompt(lease.prompt_id, tokens),
                                    error=error))
        return EpisodeGroup(lease, episodes)

    def _failed(self, lease: LeasedPrompt, error: str) -> None:
        self.env_errors += 1
        self.env_error_kinds[error_kind(error) or "raised"] += 1
        log.warning("prompt %d: %s", lease.prompt_id, error)

    def restart_stale(self, groups: list[EpisodeGroup]) -> None:  # type: ignore[override]
        """As GroupGenerator.restart_stale, with fresh episodes (and environments)."""
        for group in groups:
            if must_restart((min(e.seq.versions) for e in group.episodes if e.seq.versions),
                            self.engine.version, self.trainer_version, self.max_staleness):
                self.tokens_restarted_stale += sum(len(e.seq.tokens) for e in group.episodes)
                self.drop([group])
                fresh = self.start(group.lease)
                group.episodes = fresh.episodes
                self.groups_restarted_stale += 1

    def drop(self, groups: list[EpisodeGroup]) -> None:  # type: ignore[override]
        """The groups leave this worker unfinished: a step still running is nobody's to
        wait for, so it counts as stuck until it returns (rollout.environment.max_stuck_calls
        bounds such calls, as it bounds those past their deadlines)."""
        for g in groups:
            for e in g.episodes:
                if e.step is not None:
                    self.calls.drop(e.step.started)
                    e.step = None

    def generate_segment(self, groups: list[EpisodeGroup]) -> None:  # type: ignore[override]
        """One turn of every episode of `groups` that is ready (not finished, not waiting for
        its environment), in one engine call; then their environments' steps, each taken in
        this segment if it answers within STEP_GRACE_S, else at a later one."""
        self.read_live()
        self.restart_stale(groups)
        self._take_answers(groups)
        todo = [(e, self._room(e)) for g in groups for e in g.episodes if e.ready]
        if not todo:
            self.calls.settle([e.step.started for g in groups for e in g.episodes if e.step],
                              self.env_cfg.step_timeout_s, IDLE_WAIT_S, every=False)
            self._take_answers(groups)
            return
        # the engine keeps each sequence's KV state (torch: rollout.engine.kv_cache_tokens;
        # vLLM caches prefixes itself): the next turn prefills the environment's tokens only
        spec = SamplingSpec(max_new_tokens=max(room for _, room in todo),
                            temperature=self.temperature, keep_state=True, keep_stopped=True)
        with self.engine.lock:  # no swap between reading the version and sampling with it
            version = self.engine.version
            outs = self.engine.generate([e.context for e, _ in todo], spec)
        started = []
        for (e, room), out in zip(todo, outs, strict=True):
            tokens = out.tokens[:room]
            e.add_model_turn(tokens, out.logprobs[:room], version,
                             fed_routes(out, len(e.context), room))
            e.last_reply = reply = self.lm.decode(tokens)
            if not (out.finish_reason == "stop" and len(out.tokens) <= room):
                e.end("length")  # cut by the token budget or the context: no step on half
            elif e.env is None:
                e.end("stop")
            else:
                turn = Turn(e.env, e.messages, reply, len(e.mask) - e.policy_tokens)
                e.step = PendingStep(turn, start_step(turn, self.env_cfg, self.calls), version)
                started.append(e.step.started)
        self.calls.settle(started, self.env_cfg.step_timeout_s, STEP_GRACE_S, every=True)
        self._take_answers(groups)
        self.turns += len(todo)
        self.segments += 1
        self.sequences_decoded += len(todo)
        self._count_tokens(sum(len(out.tokens) for out in outs))

    def _take_answers(self, groups: list[EpisodeGroup]) -> None:
        """Each step of `groups` that answered or ran past its deadline, made its episode's
        move."""
        for g in groups:
            for e in g.episodes:
                s = e.step
                if s is None or not self.calls.due(s.started, self.env_cfg.step_timeout_s):
                    continue
                e.step = None
                move = answer(s.turn, s.started, self.glue, self.env_cfg, self.calls)
                self._after_step(g, e, s.turn.reply, move, s.version)

    def _room(self, e: Episode) -> int:
        """Tokens the episode's next turn may generate: what is left of max_new_tokens and
        of the model's context (at least 1: an episode with no room was ended before)."""
        left = self.cfg.rollout.max_new_tokens - e.policy_tokens
        return max(1, min(left, self.engine.context_length - len(e.context)))

    def _after_step(self, g: EpisodeGroup, e: Episode, reply: str, move: Move,
                    version: int) -> None:
        if isinstance(e.env, ToolEnvironment) and move.step is not None:
            calls, errors = e.env.take_counts()
            self.tool_calls += calls
            self.tool_error_kinds.update(errors)
        if move.error:
            self._failed(g.lease, move.error)
            e.end("stop", move.error)
            return
        if move.step.reward is not None:
            e.rewards.append(move.step.reward)
        if not goes_on(move, turns=e.turns, max_turns=self.env_cfg.max_turns,
                       policy_tokens=e.policy_tokens,
                       max_new_tokens=self.cfg.rollout.max_new_tokens,
                       context=len(e.context), context_length=self.engine.context_length):
            e.end("stop")
            return
        e.add_env_tokens(move.glue, version)
        e.messages += [{"role": "assistant", "content": reply}, *move.step.messages]
