"""Soak: the real stack for a long time, watching every process's memory.

    python bench/soak.py [--minutes 30] [--sample-s 5] [--warmup-minutes 5]

Every service runs as its own process (relayrl up's launcher) on the tiny CPU example with
no step or prompt limit, plus the embedded Redis server. Each process's resident memory
(RSS) is sampled every `--sample-s` seconds. Growth is the median of the last few samples
over the median of the first few after the warm-up (model loading, first allocations and
caches filling are not leaks). After `--minutes` the stack is stopped with SIGTERM and the
run's ledger audited from its Redis file. Ends with one JSON line: growth per process (%),
the largest, whether it is under 5 %, and the audit.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from bench.common import assign_free_ports  # noqa: E402
from relayrl.config import RunConfig, load_run_config  # noqa: E402
from relayrl_ops.launcher import Launcher  # noqa: E402

TARGET_GROWTH_PCT = 5.0
WINDOW = 3  # samples whose median is taken at each end
PROGRESS_EVERY_S = 60.0
TAIL_BYTES = 1 << 16  # several metrics rows


def rss_bytes(pid: int) -> int | None:
    """Resident memory of `pid`, or None once it has gone."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        try:
            return psutil.Process(pid).memory_info().rss
        except psutil.NoSuchProcess:
            return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except FileNotFoundError:
        return None
    return None


def soak_config(base: RunConfig, run_dir: Path) -> RunConfig:
    data = base.model_dump(mode="json")
    data.update(run_id="soak", run_dir=str(run_dir))
    data["scheduler"]["max_prompts"] = 0  # unlimited: the clock ends the run
    data["trainer"].update(max_steps=10_000_000, progress=False, plot_every=1_000_000)
    assign_free_ports(data)
    return RunConfig.model_validate(data)


def redis_pid(cfg: RunConfig) -> int:
    """The Redis server's own pid, as it reports it (embedded or not, if on this machine)."""
    from relayrl.runtime.redis_conn import connect

    client = connect(cfg.redis.url, cfg.redis.socket_timeout_s)
    try:
        return int(client.info("server")["process_id"])
    finally:
        client.close()


def processes(launcher: Launcher, redis: int) -> dict[str, int]:
    pids = {c.name: c.proc.pid for c in launcher.children if c.proc.poll() is None}
    pids["redis"] = redis
    return pids


def growth(series: list[tuple[float, int]], warmup_s: float) -> dict:
    after = [rss for t, rss in series if t >= warmup_s]
    if len(after) < 2 * WINDOW:
        raise ValueError(f"only {len(after)} samples after the warm-up; run longer, sample "
                         f"more often (--sample-s) or warm up less (--warmup-minutes)")
    first = statistics.median(after[:WINDOW])
    last = statistics.median(after[-WINDOW:])
    return {"rss_mb_after_warmup": round(first / 2**20, 1), "rss_mb_end": round(last / 2**20, 1),
            "growth_pct": round(100 * (last - first) / first, 2)}


def report_progress(now_s: float, minutes: float, cfg: RunConfig,
                    series: dict[str, list[tuple[float, int]]]) -> None:
    rss = "  ".join(f"{name} {s[-1][1] / 2**20:.0f}" for name, s in sorted(series.items()))
    step = _last_step(Path(cfg.run_dir) / "metrics.jsonl")
    print(f"soak {now_s / 60:5.1f}/{minutes:g} min  step {step}  RSS MB: {rss}", flush=True)


def audit_stopped_run(cfg: RunConfig) -> dict:
    """The ledger of the stopped run, from its Redis file (as `relayrl audit <run dir>`)."""
    from relayrl.runtime.redis_conn import redis_session
    from relayrl_ops.audit import audit_redis

    with redis_session(None, cfg.run_dir, cfg.redis.socket_timeout_s) as redis:
        report = audit_redis(redis, cfg.run_id, cfg.trainer.max_steps)
    print(report.render(), flush=True)
    return {"balanced": report.balanced, **report.counts}


def soak(cfg: RunConfig, minutes: float, sample_s: float, warmup_s: float) -> dict:
    launcher = Launcher(cfg, show_trainer_output=False)
    series: dict[str, list[tuple[float, int]]] = {}
    try:
        launcher.start()
        redis = redis_pid(launcher.cfg)
        t0 = time.monotonic()
        end = t0 + 60 * minutes
        next_report = PROGRESS_EVERY_S
        while time.monotonic() < end:
            now = time.monotonic() - t0
            for name, pid in processes(launcher, redis).items():
                if (rss := rss_bytes(pid)) is not None:
                    series.setdefault(name, []).append((now, rss))
            if now >= next_report:
                report_progress(now, minutes, cfg, series)
                next_report += PROGRESS_EVERY_S
            died = [c.name for c in launcher.children if c.proc.poll() is not None]
            if died:
                raise RuntimeError(f"{', '.join(died)} exited during the soak; see "
                                   f"{cfg.run_dir}/logs")
            time.sleep(sample_s)
    finally:
        launcher.shutdown()
    steps = _last_step(Path(cfg.run_dir) / "metrics.jsonl")
    per_process = {name: growth(s, warmup_s) for name, s in sorted(series.items())}
    worst = max(p["growth_pct"] for p in per_process.values())
    return {"bench": "soak", "minutes": minutes, "warmup_minutes": warmup_s / 60,
            "samples_per_process": min(len(s) for s in series.values()),
            "trainer_steps": steps, "processes": per_process, "max_growth_pct": worst,
            "target_growth_pct": TARGET_GROWTH_PCT, "under_target": worst < TARGET_GROWTH_PCT,
            "audit": audit_stopped_run(cfg)}


def _last_step(path: Path) -> int:
    """The step of the newest complete row, read from the file's tail (the trainer may be
    writing the last line)."""
    if not path.is_file():
        return 0
    with path.open("rb") as f:
        f.seek(max(0, f.seek(0, 2) - TAIL_BYTES))
        lines = f.read().splitlines()
    for line in reversed(lines):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            continue
    return 0


def main(argv: list[str] | None = None) -> None:
    parser = harness.parser("soak", __doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "examples/tiny_cpu.yaml"))
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--sample-s", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--warmup-minutes", type=float, default=None,
                        help="left out of the growth figure; default: a sixth of the run, "
                        "at most 5")
    parser.add_argument("--run-dir", default=None, help="keep the run here (default: a "
                        "temporary directory)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.minutes, args.sample_s, args.warmup_minutes = 0.1, 0.5, 0.03
    if args.minutes <= 0 or args.sample_s <= 0:
        raise ValueError("--minutes and --sample-s must be positive")
    warmup = args.warmup_minutes if args.warmup_minutes is not None else min(5.0,
                                                                             args.minutes / 6)
    if not 0 <= warmup < args.minutes:
        raise ValueError("--warmup-minutes: must be in [0, minutes)")
    base = load_run_config(args.config)
    with tempfile.TemporaryDirectory(prefix="relayrl-soak-") as tmp:
        run_dir = Path(args.run_dir) if args.run_dir else Path(tmp) / "run"
        result = soak(soak_config(base, run_dir), args.minutes, args.sample_s, 60 * warmup)
    harness.report(args, result)


if __name__ == "__main__":
    main()
