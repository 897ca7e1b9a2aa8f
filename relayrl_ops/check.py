"""`relayrl check CONFIG`: exercise a run's setup without starting a service.

It loads the config, builds the task (rows read, skipped and why), resolves the reward and
calls it on a few problems with a dummy completion, builds the environment and steps it
once when one is configured, builds the eval sets as the service that evaluates builds
them at start (relayrl_torch.evaluation.sets), and prints what the run will do: the model,
the engine and its window, the prompt and response limits, and a rough memory estimate per
service (relayrl_ops.memory_plan). What a service refuses only at start (an eval set, a
LoRA adapter the model refuses, a vLLM dtype) fails here with the service's own message.
Every failure is printed under its heading; the exit status is 1 when any step failed (2
for a config that does not load).
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from relayrl.config import ConfigError, HfModel, PretrainedModel, RunConfig, VllmEngineConfig
from relayrl_ops.memory_plan import (
    GIB,
    adapter_parameters,
    count_parameters,
    gpu_loads,
    gpu_memory,
    longest_prompt,
    planned_memory,
    row_tokens,
    sample_problems,
)

DUMMY_COMPLETION = "42"  # what the reward and the environment are called with
REWARD_ROWS = 3  # problems the reward is called on


class Report:
    """What the check found, printed as it goes; `failed` counts the steps that failed."""

    def __init__(self, out: Callable[[str], None] = print):
        self.out, self.failed = out, 0

    def line(self, text: str) -> None:
        """Print one line of the report."""
        self.out(text)

    def fail(self, what: str, err: BaseException | str) -> None:
        """Count a failed step and print what failed and why."""
        self.failed += 1
        message = err if isinstance(err, str) else f"{type(err).__name__}: {err}"
        self.out(f"  FAILED {what}: {message}")

    def step(self, what: str, fn: Callable[[], Any]) -> Any:
        """fn(), or None with the failure reported (a user's code may raise anything)."""
        try:
            return fn()
        except ConfigError as err:
            self.fail(what, str(err))
        except Exception as err:
            self.fail(what, err)
            self.out("    " + "    ".join(traceback.format_exception(err)[-3:]).rstrip())
        return None


def check(cfg: RunConfig, out: Callable[[str], None] = print) -> int:
    """`relayrl check`: build the model, engine, task, reward and environment once and print
    the run's plan and memory; 0 when every step passed, 1 otherwise."""
    report = Report(out)
    model_dir = _model(cfg, report)
    _engine(cfg, report)
    task = _task(cfg, report)
    if task is not None:
        _reward(cfg, task, report)
        if cfg.rollout.environment is not None:
            _environment(cfg, task, report)
        _eval_sets(cfg, task, report)
    plan_rows = _memory(cfg, model_dir, report, task)
    _placement(cfg, report, plan_rows)
    report.line("check: " + ("every step passed" if not report.failed
                             else f"{report.failed} step(s) FAILED"))
    return 1 if report.failed else 0


# The model ---------------------------------------------------------------------------------

def _model(cfg: RunConfig, report: Report) -> Path | None:
    m = cfg.model
    if isinstance(m, HfModel):
        where = Path(m.path)
    elif isinstance(m, PretrainedModel):  # converted once, as every service would
        from relayrl_torch.models import resolve_model_path

        where = report.step("model", lambda: resolve_model_path(m, cfg.task)) or m.converted_dir
    else:
        from relayrl_torch.models.cache import tiny_model_dir

        where = tiny_model_dir(m, cfg.task)
    built = (where / "config.json").is_file()
    note = "" if built else (" (not there yet: `relayrl prepare` or `relayrl up` builds it)"
                             if not isinstance(m, HfModel) else " (MISSING)")
    report.line(f"model: kind {m.kind}, {where}{note}")
    if isinstance(m, HfModel) and not built:
        report.fail("model", f"model.path: {where} holds no config.json")
        return None
    params = report.step("model parameters",
                         lambda: count_parameters(cfg, where if built else None))
    if params is not None:
        report.line(f"  parameters: {params:,} ({params / 1e6:.1f} M); the trainer holds them in "
                    f"float32 (trainer.precision {cfg.trainer.precision})")
    lora = cfg.trainer.lora
    if params is not None and lora is not None:  # wrapped as the trainer wraps it at start
        adapter = report.step("trainer.lora",
                              lambda: adapter_parameters(cfg, where if built else None))
        if adapter is not None:
            report.line(f"  adapter: {adapter:,} parameters (trainer.lora rank {lora.rank}, "
                        f"target_modules {lora.target_modules!r})")
    limits = report.step("model limits", m.limits)
    if limits is not None:
        report.line(f"  context: {limits.context_length} tokens, vocabulary {limits.vocab_size} "
                    f"({limits.source})")
    return where if built else None


# The engine and its window ----------------------------------------------------------------

def _engine(cfg: RunConfig, report: Report) -> None:
    e, r = cfg.rollout.engine, cfg.rollout
    if isinstance(e, VllmEngineConfig):
        ports = (f", internal ports {e.port_range[0]}-{e.port_range[1]}"
                 if getattr(e, "port_range", None) else "")
        report.line(f"engine: vllm, dtype {e.dtype}, max_model_len "
                    f"{e.max_model_len or 'the model context'}, KV cache "
                    f"{e.kv_cache_gib:g} GiB a worker{ports}; {r.num_workers} worker(s)")
        from rollout_svc.engines.factory import vllm_dtype

        # as a worker refuses it
        report.step("rollout.engine.dtype", lambda: vllm_dtype(cfg.rollout.engine, cfg.model))
    else:
        report.line(f"engine: torch on {e.device}, float32, KV cache kept for "
                    f"{e.kv_cache_tokens} tokens; {r.num_workers} worker(s)")
    window = report.step("engine window", cfg.prompt_window)
    if window is None:
        return
    report.line(f"  window: {window.engine} tokens ({window.engine_source})")
    report.line(f"  prompts: at most {window.longest} tokens ({window.describe()}); "
                f"responses: at most {r.max_new_tokens} tokens (rollout.max_new_tokens)")
    if window.longest < 1:
        report.fail("engine window", f"rollout.max_new_tokens {r.max_new_tokens} leaves no "
                    f"room for a prompt in {window.engine_source} ({window.engine})")


# The task, its reward and environment -----------------------------------------------------

def _task(cfg: RunConfig, report: Report) -> Any:
    from relayrl_tasks.tasks import load_run_task
    from relayrl_torch.models import pretrained_dir

    t = cfg.task
    where = getattr(t, "path", None) or getattr(t, "hub", None) or getattr(t, "generator", "")
    report.line(f"task: {t.source}{' ' + str(where) if where else ''}")
    task = report.step("task", lambda: load_run_task(cfg, pretrained_dir))
    if task is None:
        return None
    train = getattr(task, "_train", None)
    skipped = getattr(task, "skipped", None)
    held = len(task.eval_problems())
    if train is not None:
        report.line(f"  rows: {len(train)} to train on, {held} held out")
    elif t.source == "dataset":
        report.line(f"  rows: streamed (counted as they are read), {held} held out")
    else:
        report.line(f"  problems: generated, {held} held out")
    if isinstance(skipped, dict) and skipped:
        for reason, n in sorted(skipped.items()):
            report.line(f"  skipped: {n} row(s): {reason}")
    elif isinstance(skipped, int) and skipped:
        report.line(f"  skipped: {skipped} problem(s) too long or unusable")
    elif train is not None:
        report.line("  skipped: none")
    return task


def _reward(cfg: RunConfig, task: Any, report: Report) -> None:
    from relayrl_tasks.rewards import get_reward, score_group
    from relayrl_tasks.tasks import reward_spec

    spec = reward_spec(cfg.task)
    fn = report.step("reward", lambda: get_reward(spec))
    if fn is None:
        return
    report.line(f"reward: {spec} ({fn!r})")
    problems = sample_problems(task, REWARD_ROWS)
    for p in problems:
        scores = report.step(f"reward on prompt {p.prompt_id}", lambda p=p: score_group(
            fn, [DUMMY_COMPLETION], p.reference, p.metadata, cfg.buffer.reward_range,
            prompt=p.messages or p.text))
        if scores is None:
            continue
        value, error = scores[0]
        if error:
            report.fail(f"reward on prompt {p.prompt_id} (completion {DUMMY_COMPLETION!r}, "
                        f"reference {p.reference!r})", error)
        else:
            report.line(f"  prompt {p.prompt_id}: completion {DUMMY_COMPLETION!r}, reference "
                        f"{p.reference!r} -> {value:g}")


def _environment(cfg: RunConfig, task: Any, report: Report) -> None:
    from relayrl.plugins.envs.protocol import as_step, check_messages
    from relayrl_tasks.envs.loading import load_environment, make_environment

    env_cfg = cfg.rollout.environment
    assert env_cfg is not None
    report.line(f"environment: {env_cfg.cls}, at most {env_cfg.max_turns} turns, options "
                f"{json.dumps(env_cfg.options)}")
    cls = report.step("environment", lambda: load_environment(env_cfg.cls))
    if cls is None:
        return
    env = report.step("environment constructor",
                      lambda: make_environment(cls, env_cfg.options))
    problems = sample_problems(task, 1)
    if env is None or not problems:
        return
    opened = report.step(f"{cls.__name__}.reset", lambda: env.reset(problems[0]))
    if opened is not None:
        if report.step(f"{cls.__name__}.reset", lambda: check_messages(
                opened, f"{cls.__name__}.reset")) is None:
            return
    if report.failed:
        return
    step = report.step(f"{cls.__name__}.step", lambda: as_step(
        env.step(DUMMY_COMPLETION), f"{cls.__name__}.step"))
    if step is not None:
        shown = sum(len(m["content"]) for m in step.messages)
        report.line(f"  reset: {'its own opening' if opened else 'the task prompt'}; step("
                    f"{DUMMY_COMPLETION!r}): {len(step.messages)} message(s) of {shown} "
                    f"characters, reward {step.reward}, done {step.done}")


# The eval sets ----------------------------------------------------------------------------

def _eval_sets(cfg: RunConfig, task: Any, report: Report) -> None:
    """build_sets, as the trainer (eval.mode inline) or the evaluator (separate) calls it at
    start, so a set either would refuse (no held-out problems, a task file or reward that
    is not there) fails the check; none is built where no service evaluates."""
    from relayrl_ops.plan import plan

    e = cfg.eval
    if not e.every:
        report.line("eval: none (eval.every 0)")
        return
    trainer = next(p for p in plan(cfg) if p.name == "trainer")
    if e.mode == "inline" and trainer.ranks > 1:
        report.line(f"eval: none: the trainer runs {trainer.ranks} torchrun ranks and "
                    "evaluates nothing itself (eval.mode separate does)")
        return
    from relayrl_torch.evaluation.sets import build_sets

    report.line(f"eval: every {e.every} steps (eval.mode {e.mode}), {len(e.sets)} set(s)")
    sets = report.step("eval sets", lambda: build_sets(cfg, task))
    for s in sets or ():
        report.line(f"  {s.name}: {len(s.problems)} problem(s), reward {s.reward_name}, "
                    f"{s.samples} sample(s) each{', greedy too' if s.greedy else ''}"
                    f"{', as episodes' if s.environment else ''}")


# Memory ------------------------------------------------------------------------------------

def _memory(cfg: RunConfig, model_dir: Path | None, report: Report, task: Any
            ) -> list[tuple[str, int, list[tuple[str, float]]]] | None:
    longest = (report.step("longest prompt", lambda: longest_prompt(cfg, task))
               if task is not None else None)
    plan = planned_memory(cfg, model_dir, longest)
    if plan is None:
        report.line("memory: not estimated (the parameter count is unknown)")
        return None
    report.line("memory (rough: weights, gradients, optimizer state, kept copies, stored "
                "versions, KV cache and the trainer's activations; framework and Python "
                "overhead not counted):")
    row = row_tokens(cfg, longest)
    why = ("an environment's episode fills the engine's window" if cfg.rollout.environment
           else f"the longest prompt measured, {longest} tokens, and rollout.max_new_tokens"
           if longest is not None else "the longest prompt the engine takes and "
           "rollout.max_new_tokens")
    report.line(f"  rows of at most {row} tokens ({why})")
    total = 0.0
    for service, count, parts in plan:
        size = sum(b for _, b in parts)
        total += size * count
        what = "; ".join(f"{name} {b / GIB:.2f}" for name, b in parts if b)
        report.line(f"  {service}: {size / GIB:.2f} GiB{f' x {count}' if count > 1 else ''} "
                    f"({what})")
    report.line(f"  together: about {total / GIB:.2f} GiB")
    return plan


# Where each process runs ------------------------------------------------------------------

def _placement(cfg: RunConfig, report: Report,
               rows: list[tuple[str, int, list[tuple[str, float]]]] | None) -> None:
    """The plan (relayrl_ops.plan): each process's node, GPUs, environment, command line,
    ports and GPU memory; a GPU the plan fills past its memory fails the check."""
    from relayrl_ops.plan import plan

    processes = plan(cfg)
    res = cfg.resources
    if res is None:
        report.line("placement: none (no resources section): every process sees every GPU "
                    "of its machine, and CUDA gives each cuda:0")
        return
    config = str(Path(cfg.run_dir) / "config.yaml")
    on_gpu = gpu_memory(cfg, rows, processes) if rows is not None else {}
    report.line(f"placement: {len(res.nodes)} node(s), {len(processes)} process(es)")
    for p in processes:
        node = res.nodes[p.node]
        held = (f", {on_gpu[p.name] / GIB:.2f} GiB on each" if p.name in on_gpu and p.gpus
                else "")
        report.line(f"  {p.name}: node {p.node} ({node.address}), GPUs "
                    f"{list(p.gpus or ()) or 'none'}{held}"
                    + (f", {p.ranks} torchrun ranks" if p.ranks > 1 else ""))
        env = " ".join(f"{k}={v}" for k, v in p.env.items())
        report.line(f"    {env} {' '.join(p.argv(config))}".rstrip())
        if p.ports:
            report.line("    ports: " + ", ".join(f"{v} ({k})" for k, v in p.ports.items()))
    if not on_gpu:
        return
    for (node, gpu), (used, names) in sorted(gpu_loads(cfg, processes, on_gpu).items()):
        limit = res.nodes[node].gpu_memory_gib * GIB
        line = (f"  node {node} GPU {gpu}: {used / GIB:.2f} of {limit / GIB:.2f} GiB "
                f"({', '.join(names)})")
        if used > limit:
            report.fail("placement", f"{line.strip()}: more than the GPU holds "
                        f"(resources.nodes[{node}].gpu_memory_gib)")
        else:
            report.line(line)
