"""Peak memory of every service of a real run, against what `relayrl check` plans for it.

    python bench/memory.py [--config examples/smollm2_cpu.yaml] [--set key=value ...]
                           [--steps 6] [--sample-s 0.5]

Runs the config's stack (relayrl up's launcher, every service its own process, embedded
Redis) for `--steps` trainer steps and samples each service's memory, its child processes
included (vLLM's engine core runs in one), every `--sample-s` seconds. Prints each
service's peak resident memory (RSS) beside what `relayrl check` plans for it, and the
stack's peak as a ratio to TARGET_GIB.

The stack's memory is the RAM it holds: the peak of the processes' summed proportional set
sizes (PSS: each page shared by n processes counted 1/n in each), the zygote the services
are forked from included, with shared memory (the weight versions in /dev/shm that the
trainer writes, the relay keeps and the workers read, and spare files no process maps)
counted once, as the growth of the machine's Shmem since the run started. A sum of RSS
counts a shared page once per process that maps it (the libraries the zygote imported
before forking, the versions), and misses files no process maps; it is reported beside.
Ends with one JSON line (bench/results/memory.jsonl).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from bench.common import assign_free_ports  # noqa: E402
from bench.soak import _last_step, redis_pid  # noqa: E402
from relayrl.config import RunConfig, load_run_config  # noqa: E402
from relayrl_ops.launcher import Launcher  # noqa: E402

TARGET_GIB = 5.0  # the whole stack of the SmolLM2 example, float32
MIB = 2**20


def rollup(pid: int) -> tuple[int, int, int] | None:
    """(RSS, PSS, the PSS of its shared memory) of one process, in bytes; None once gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    kib = {k: int(v.split()[0]) for k, v in
           (line.split(":", 1) for line in text.splitlines()[1:] if ":" in line)}
    return kib["Rss"] * 1024, kib["Pss"] * 1024, kib.get("Pss_Shmem", 0) * 1024


def tree_memory(pid: int, children: bool = True) -> tuple[int, int, int] | None:
    """rollup() summed over `pid` and (unless `children` is False) its descendants."""
    import psutil

    try:
        pids = [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))] \
            if children else [pid]
    except psutil.NoSuchProcess:
        return None
    got = [r for p in pids if (r := rollup(p)) is not None]
    return tuple(map(sum, zip(*got, strict=True))) if got else None  # type: ignore[return-value]


def shmem() -> int:
    """The machine's shared memory (tmpfs, /dev/shm included) in bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Shmem:"):
            return int(line.split()[1]) * 1024
    return 0


def service(name: str) -> str:
    """A launcher child's service: rollout-0 and rollout-1 are both the rollout worker."""
    return name.rstrip("0123456789").rstrip("-_") or name


def measured_config(base: RunConfig, run_dir: Path, steps: int) -> RunConfig:
    data = base.model_dump(mode="json")
    data.update(run_id="memory", run_dir=str(run_dir))
    data["trainer"].update(max_steps=steps, progress=False, plot_every=1_000_000)
    data["trainer"]["checkpoint"]["every"] = steps  # one checkpoint, as a run writes them
    data["scheduler"]["max_prompts"] = 0
    data["eval"]["every"] = 0  # the evaluator's memory is the trainer's, inline
    assign_free_ports(data)
    return RunConfig.model_validate(data)


def planned(cfg: RunConfig) -> dict[str, float]:
    """MiB per process that `relayrl check` plans (weights, caches and activations), for
    the model the run prepared."""
    from relayrl.config import HfModel, PretrainedModel
    from relayrl_ops.memory_plan import longest_prompt, planned_memory
    from relayrl_tasks.tasks import load_run_task
    from relayrl_torch.models.cache import pretrained_dir, tiny_model_dir

    m = cfg.model
    where = (Path(m.path) if isinstance(m, HfModel) else m.converted_dir
             if isinstance(m, PretrainedModel) else tiny_model_dir(m, cfg.task))
    # rows as long as the task's prompts make them, as relayrl check sizes them
    task = load_run_task(cfg, pretrained_dir)
    plan = planned_memory(cfg, where, longest_prompt(cfg, task)) or []
    names = {"rollout worker": "rollout"}
    return {names.get(name, name): round(sum(b for _, b in parts) / MIB, 1)
            for name, _, parts in plan}


def measure(cfg: RunConfig, sample_s: float, timeout_s: float) -> dict:
    """Peak RSS and PSS (MiB) per process, the stack's peak summed PSS and RSS (MiB), and the
    steps reached."""
    launcher = Launcher(cfg, show_trainer_output=False)
    rss_peaks: dict[str, int] = {}
    pss_peaks: dict[str, int] = {}
    private_at_peak: dict[str, int] = {}  # PSS less shared memory, at the stack's peak
    stack_pss = stack_rss = shm_at_peak = 0
    shm_before = shmem()
    try:
        launcher.start()
        pids = {c.name: c.proc.pid for c in launcher.children}
        pids["redis"] = redis_pid(launcher.cfg)
        pids["zygote"] = launcher.zygote.proc.pid
        deadline = time.monotonic() + timeout_s
        while launcher.supervise() is None and time.monotonic() < deadline:
            shm = max(shmem() - shm_before, 0)
            total_rss, total_pss, private = 0, shm, {}  # shared memory, once
            for name, pid in pids.items():
                # the zygote's own pages only: its children are the services
                got = tree_memory(pid, children=name != "zygote")
                if got is None:
                    continue
                rss, pss, pss_shmem = got
                rss_peaks[name] = max(rss_peaks.get(name, 0), rss)
                pss_peaks[name] = max(pss_peaks.get(name, 0), pss)
                total_rss, total_pss = total_rss + rss, total_pss + pss - pss_shmem
                private[name] = pss - pss_shmem
            if total_pss > stack_pss:
                stack_pss, shm_at_peak, private_at_peak = total_pss, shm, private
            stack_rss = max(stack_rss, total_rss)
            time.sleep(sample_s)
    finally:
        launcher.shutdown()
    mib = lambda d: {k: round(v / MIB, 1) for k, v in sorted(d.items())}  # noqa: E731
    return {"peak_rss_mib": mib(rss_peaks), "peak_pss_mib": mib(pss_peaks),
            "stack_pss_mib": round(stack_pss / MIB, 1),
            "at_peak_mib": {"shared memory": round(shm_at_peak / MIB, 1),
                            **mib(private_at_peak)},
            "stack_rss_mib": round(stack_rss / MIB, 1),
            "steps": _last_step(Path(cfg.run_dir) / "metrics.jsonl")}


def main(argv: list[str] | None = None) -> None:
    parser = harness.parser("memory", __doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "examples/smollm2_cpu.yaml"))
    parser.add_argument("--set", action="append", default=[], dest="overrides",
                        help="a config override, as relayrl up --set takes it")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--sample-s", type=float, default=0.5)
    parser.add_argument("--timeout-s", type=float, default=1800.0)
    args = parser.parse_args(argv)
    if args.smoke:
        args.config, args.steps, args.sample_s = str(ROOT / "examples/tiny_cpu.yaml"), 2, 0.2
    with tempfile.TemporaryDirectory(prefix="relayrl-memory-") as tmp:
        cfg = measured_config(load_run_config(args.config, args.overrides), Path(tmp) / "run",
                              args.steps)
        m = measure(cfg, args.sample_s, args.timeout_s)
        plan = planned(cfg)
    for name, mib in m["peak_rss_mib"].items():
        print(f"{name:<14} peak RSS {mib:8.0f} MiB, PSS {m['peak_pss_mib'][name]:8.0f} MiB   "
              f"planned {plan.get(service(name), 0):8.0f} MiB", flush=True)
    stack = m["stack_pss_mib"] / 1024
    print("at the stack's peak: " + ", ".join(f"{k} {v:.0f}" for k, v in
                                             m["at_peak_mib"].items()) + " MiB", flush=True)
    print(f"stack peak {stack:.2f} GiB (summed PSS, shared memory once; summed RSS "
          f"{m['stack_rss_mib'] / 1024:.2f} GiB) = {stack / TARGET_GIB:.2f} of the "
          f"{TARGET_GIB:g} GiB target", flush=True)
    harness.report(args, {"bench": "memory", "config": Path(args.config).name,
                          "overrides": args.overrides,
                          "steps": m["steps"], "peak_rss_mib": m["peak_rss_mib"],
                          "peak_pss_mib": m["peak_pss_mib"], "planned_mib": plan,
                          "stack_peak_gib": round(stack, 2),
                          "at_stack_peak_mib": m["at_peak_mib"],
                          "stack_rss_sum_gib": round(m["stack_rss_mib"] / 1024, 2),
                          "target_gib": TARGET_GIB,
                          "ratio_to_target": round(stack / TARGET_GIB, 3)})


if __name__ == "__main__":
    main()
