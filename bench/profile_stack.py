"""Where RelayRL's time goes, per trained sample: every process of a config's stack, sampled
by py-spy over a steady window of the run, each sample put in one bucket by what its stack
is doing (BUCKETS: the engine, the trainer's forward and backward, encoding and checking
samples, Redis, gRPC, the weight planes, evaluation, metrics, ...).

    python bench/profile_stack.py                             # the tiny example
    python bench/profile_stack.py --config examples/smollm2_cpu.yaml --skip 3 --steps 6

The run is the config as it ships (eval, plots and checkpoints included), on free ports.
Once the trainer has made --skip steps, py-spy (in the benches' own venv, bench/.venv)
records each Python process for the next --steps steps; each process's CPU seconds over the
window come from /proc and are split by its samples' buckets, Redis's whole. Prints a table
of CPU milliseconds per trained sample, by bucket and process, the window's wall time per
sample, the share of the machine's cores left idle and the share py-spy itself took, and a
JSON line.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import harness  # noqa: E402
from bench.common import ROOT, assign_free_ports  # noqa: E402
from bench.tools_venv import bench_tool  # noqa: E402
from relayrl.config import RunConfig, load_run_config  # noqa: E402
from relayrl.runtime.metrics import StepRecord, read_records  # noqa: E402
from relayrl_ops.launcher import Launcher  # noqa: E402

# First match wins, tested against the stack's files (root to leaf, as py-spy names them:
# relative to site-packages or the working directory), so an operation is charged whole: a
# Redis call made while publishing weights is publishing.
BUCKETS: list[tuple[str, str]] = [
    ("evaluation", r"eval_svc/"),
    ("checkpoint", r"trainer_svc/checkpoint\.py"),
    ("weight publish", r"trainer_svc/publisher\.py|relay_svc/"),
    ("weight pull", r"rollout_svc/weight_refresh\.py|relayrl_torch/weights?/"),
    ("metrics, plots, logs", r"relayrl/runtime/metrics\.py|telemetry\.py|matplotlib|prometheus|"
                             r"trainer_svc/plots\.py|logging/__init__\.py|tqdm"),
    ("engine (generate)", r"rollout_svc/(engines/torch|engines/vllm|serving/batcher)\.py|"
                          r"relayrl_torch/sampling/"),
    ("reward", r"relayrl/plugins/rewards/"),
    ("engine/trainer log-prob check", r"trainer_svc/parity\.py"),
    ("trainer forward/backward", r"trainer_svc/(objective|learner|losses/)|"
                                 r"torch/(autograd|optim)/"),
    ("encode, decode, validate, collate", r"relayrl/contracts/(messages|codec)|msgpack|_pb2|"
                                          r"protobuf|trainer_svc/batching\.py|buffer_svc/(submit|assembler)\.py"),
    ("Redis client", r"(^|[;/])redis/|relayrl/(contracts/streams|runtime/(outage|redis_conn))"
                     r"\.py"),
    ("gRPC", r"(^|[;/])grpc/|relayrl/runtime/grpc_util\.py"),
    ("scheduler leases", r"scheduler_svc/"),
]
OTHER = "other"
FRAME = re.compile(r" \((.*?):\d+\)")


def bucket(stack: str) -> str:
    files = ";".join(FRAME.findall(stack)) or stack
    for name, pattern in BUCKETS:
        if re.search(pattern, files):
            return name
    return OTHER


def split_samples(raw: str) -> Counter:
    """py-spy's raw (collapsed) output, one 'frame;frame;... count' a line, by bucket."""
    counts: Counter = Counter()
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit():
            counts[bucket(stack)] += int(n)
    return counts


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()


def cpu_seconds(pid: int) -> float:
    """User and system CPU so far of a process and the processes under it (vLLM's engine
    core is a child of its worker), from Linux /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                children.setdefault(int(_stat(int(entry.name))[1]), []).append(int(entry.name))
            except OSError:  # gone meanwhile
                continue
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = _stat(p)
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
        todo.extend(children.get(p, []))
    return total / os.sysconf("SC_CLK_TCK")


def machine_ticks() -> tuple[int, int]:
    """(idle, all) CPU ticks of the whole machine so far, from /proc/stat."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    return ticks[3] + ticks[4], sum(ticks)  # idle and iowait


def steps_done(metrics: Path) -> list[StepRecord]:
    return [r for r in read_records(metrics) if r.figures.step_s is not None]


def wait_steps(metrics: Path, n: int, launcher: Launcher) -> list[StepRecord]:
    while len(rows := steps_done(metrics)) < n:
        time.sleep(0.2)
        if launcher.supervise() is not None:
            raise RuntimeError(f"the run ended before step {n}; see {launcher.run_dir}/logs")
    return rows


def profile(cfg: RunConfig, skip: int, steps: int, rate: int) -> dict:
    py_spy = bench_tool("py-spy")
    metrics = Path(cfg.run_dir) / "metrics.jsonl"
    launcher = Launcher(cfg, show_trainer_output=False)
    out = Path(cfg.run_dir) / "profile"
    try:
        launcher.start()
        out.mkdir(parents=True, exist_ok=True)
        wait_steps(metrics, skip, launcher)
        procs = {c.name: c.proc.pid for c in launcher.children if c.proc is not None}
        cpu0 = {name: cpu_seconds(pid) for name, pid in procs.items()}
        redis0 = cpu_seconds(launcher.embedded.pid) if launcher.embedded else 0.0
        spies = {name: subprocess.Popen(
            [str(py_spy), "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw",
             "--subprocesses", "--nonblocking", "--output", str(out / f"{name}.txt")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for name, pid in procs.items()}
        t0, ticks0 = time.monotonic(), machine_ticks()
        first = len(steps_done(metrics))
        rows = wait_steps(metrics, first + steps, launcher)
        wall, ticks1 = time.monotonic() - t0, machine_ticks()
        spy_cpu = sum(cpu_seconds(spy.pid) for spy in spies.values())
        cpu = {name: cpu_seconds(pid) - cpu0[name] for name, pid in procs.items()}
        redis_cpu = cpu_seconds(launcher.embedded.pid) - redis0 if launcher.embedded else 0.0
        for spy in spies.values():
            spy.send_signal(2)  # SIGINT: py-spy writes what it has and exits
        for spy in spies.values():
            spy.wait(timeout=60)
    finally:
        launcher.shutdown()
    window = rows[first:first + steps]
    samples = sum(r.figures.samples or 0 for r in window)
    if not samples:
        raise RuntimeError("no sample trained in the window: widen --steps")
    table: dict[str, dict[str, float]] = {}
    for name in procs:
        counts = split_samples((out / f"{name}.txt").read_text())
        total = sum(counts.values())
        for b, n in counts.items():
            table.setdefault(b, {})[name] = 1000 * cpu[name] * n / total / samples
    if redis_cpu:
        table["Redis server"] = {"redis": 1000 * redis_cpu / samples}
    busy = sum(cpu.values()) + redis_cpu
    return {"samples": samples, "steps": len(window), "wall_s": round(wall, 1),
            "wall_ms_per_sample": round(1000 * wall / samples, 2),
            "cpu_ms_per_sample": round(1000 * busy / samples, 2),
            "idle_share": round((ticks1[0] - ticks0[0]) / (ticks1[1] - ticks0[1]), 2),
            "py_spy_cpu_share": round(spy_cpu / (wall * os.cpu_count()), 2),
            "ms_per_sample": {b: {p: round(v, 3) for p, v in sorted(row.items())}
                              for b, row in sorted(table.items(),
                                                   key=lambda kv: -sum(kv[1].values()))}}


def markdown(result: dict, config: str) -> str:
    names = sorted({p for row in result["ms_per_sample"].values() for p in row})
    lines = [f"CPU ms per trained sample, `{config}`, {result['steps']} steps, "
             f"{result['samples']} samples; wall {result['wall_ms_per_sample']} ms a sample, "
             f"CPU {result['cpu_ms_per_sample']} ms; the machine's cores idle "
             f"{result['idle_share']:.0%} of the window, py-spy itself busy "
             f"{result['py_spy_cpu_share']:.0%}.", "",
             "| bucket | total | " + " | ".join(names) + " |",
             "|---|---|" + "---|" * len(names)]
    for b, row in result["ms_per_sample"].items():
        cells = " | ".join(f"{row[n]:.2f}" if n in row else "" for n in names)
        lines.append(f"| {b} | {sum(row.values()):.2f} | {cells} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = harness.parser("profile_stack", __doc__.splitlines()[0])
    parser.add_argument("--config", default="examples/tiny_cpu.yaml")
    parser.add_argument("--skip", type=int, default=100, help="steps before the window")
    parser.add_argument("--steps", type=int, default=200, help="steps in the window")
    parser.add_argument("--rate", type=int, default=20, help="py-spy samples a second")
    args = parser.parse_args(argv)
    if args.smoke:
        if not (ROOT / "bench" / ".venv").is_dir():
            harness.skip(args, "py-spy runs from the benches' own venv (bench/.venv), made "
                         "on first use")
        args.skip, args.steps = 2, 4
    data = load_run_config(args.config).model_dump(mode="json")
    data["run_dir"] = str(ROOT / "runs" / "bench_profile" / Path(args.config).stem)
    shutil.rmtree(data["run_dir"], ignore_errors=True)  # else it resumes an earlier run's end
    data["trainer"]["max_steps"] = args.skip + args.steps + 1_000  # stopped after the window
    data["trainer"]["progress"] = False
    assign_free_ports(data)
    result = profile(RunConfig.model_validate(data), args.skip, args.steps, args.rate)
    print(markdown(result, args.config))
    harness.report(args, {"bench": "profile_stack", "config": args.config, **result})


if __name__ == "__main__":
    main()
