"""The real stack on heavy-tailed generation: synchronous against asynchronous, in one run.

    python bench/longtail.py [--steps 30] [--groups 8] [--median 16] [--p99-ratio 10]
                             [--workers 2] [--staleness 2] [--rounds 3]

Every service runs as its own process (relayrl up's launcher) on the tiny CPU example, with
response lengths drawn from a lognormal whose p99 is `p99-ratio` times its median (the
engines ignore end-of-sequence), `--groups` prompts of `group_size` samples per trainer step
(8 x 8 = 64 samples by default: small beside the hundreds of a real RL step, enough for
the batch shapes of the modes to differ). Four modes on the same prompts and lengths, named
as in `relayrl simulate`:

- sync: one batch of prompts in flight at a staleness bound of 0; the next is handed out
  only once the trainer has stepped past it and starts on the weights that step made, so
  generation and training alternate and each batch waits for its longest response.
- async_batch: batch-level asynchrony (staleness bound `--staleness`, 2 by default, so two
  batches of prompts in flight): workers keep generating, in larger batches, while the
  trainer trains, but each engine call still runs until its longest response ends, so a
  worker's batch drains before new prompts join it.
- async: trajectory-level asynchrony: as async_batch, with every sequence on its own.
  Responses are generated in segments of `--segment` tokens; at every boundary finished
  groups leave, new prompts join and the worker may move to newer weights, so a long
  response never holds a batch (continuous batching at segment granularity).
- async_repack: as async, with the scheduler repacking: when no new prompt can be handed
  out, a worker left with a few long sequences hands them (token state and all) to the
  fullest worker with room, so they decode in one batch there.
- async_when_behind (only when named in --modes): as async, with rollout.reload
  when_behind: a worker holding groups moves to newer weights only once it may start no
  prompt on its own (the simulator's sim.tails preempt), not at every boundary.

Reports trained samples/s after a warm-up (only what the trainer kept: a group dropped as
stale is no throughput), and beside it the work wasted: response tokens the trainer dropped,
tokens the workers threw away restarting stale groups, and context re-prefilled after a
repack moved a group without its KV state; staleness per sequence and per token as
distributions (mean, p50, p99, max; lags of 9 or more count as 9); where each worker's loop
time went and how full its engine calls were. Every mode runs `--rounds` times, in rounds;
a mode's figure is its median run. Ends with one JSON line: trained_samples_per_s and
staleness_max per mode, the ratios of the medians, and per round (target: trajectory-level
async >= 2x sync).
"""

from __future__ import annotations

import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from bench.common import CpuSampler, assign_free_ports, run_stack, window_figures  # noqa: E402
from relayrl.config import RunConfig, load_run_config  # noqa: E402
from relayrl.rules.staleness import inflight_prompts  # noqa: E402
from relayrl.runtime.metrics import StepRecord  # noqa: E402
from relayrl_sim.accounting import distribution  # noqa: E402

MODES = ("sync", "async_batch", "async", "async_repack", "async_when_behind")
DEFAULT_MODES = MODES[:4]
SEGMENTED = ("async", "async_repack", "async_when_behind")


def mode_config(base: RunConfig, mode: str, run_dir: Path, args) -> RunConfig:
    data = base.model_dump(mode="json")
    # sync generates one training batch at a time; async keeps more batches in flight (the
    # scheduler's default: relayrl.rules.staleness.inflight_prompts), so its workers run more
    # sequences at once
    groups = args.groups
    in_flight = groups if mode == "sync" else (args.inflight
                                                or inflight_prompts(groups, args.staleness))
    active = max(1, -(-in_flight // args.workers))
    data.update(run_id=f"longtail-{mode}", run_dir=str(run_dir))
    data["scheduler"].update(start_after_workers=args.workers,
                             max_inflight_prompts=groups if mode == "sync" else args.inflight,
                             repack=mode == "async_repack")
    data["buffer"].update(groups_per_batch=groups)
    # sync at a bound of 0: with the bound above 0 its next batch would start on the weights
    # of the step being trained (lag 1), a one-step-off pipeline rather than a barrier
    data["trainer"].update(max_steps=args.steps,
                           max_staleness=0 if mode == "sync" else args.staleness,
                           checkpoint={"every": args.steps},
                           plot_every=args.steps, progress=False)
    data["eval"]["every"] = 0
    data["rollout"].update(num_workers=args.workers,
                           max_active_groups=active, max_new_tokens=args.max_tokens,
                           segment_tokens=args.segment if mode in SEGMENTED else 0,
                           reload="when_behind" if mode == "async_when_behind"
                           else "every_segment")
    data["bench"].update(synthetic_length_median=args.median,
                         synthetic_length_p99_ratio=args.p99_ratio)
    assign_free_ports(data)  # after num_workers: workers need a block of consecutive ports
    return RunConfig.model_validate(data)


def run_mode(cfg: RunConfig, warmup: int) -> dict:
    metrics = Path(cfg.run_dir) / "metrics.jsonl"
    with CpuSampler(metrics) as cpu:
        every = run_stack(cfg)
    rows = [r for r in every if r.figures.samples is not None]
    start, end = rows[warmup - 1], rows[-1]
    window = window_figures(rows, start.step, end.step)
    tokens = sum(r.figures.samples * r.figures.response_len_mean for r in rows[warmup:])
    elapsed = end.figures.elapsed_s - start.figures.elapsed_s
    sched_log = Path(cfg.run_dir) / "logs" / "scheduler.log"
    recalls = sched_log.read_text().count("repack: lease") if sched_log.is_file() else 0
    busy = sum(r.figures.step_s for r in rows[warmup:])
    fill, loop = worker_loops(Path(cfg.run_dir) / "logs")
    restarted, reprefilled = worker_waste(Path(cfg.run_dir) / "logs")
    reloads = sum(log.read_text().count(RELOAD_LINE)
                  for log in (Path(cfg.run_dir) / "logs").glob("rollout-*.log"))
    measured = rows[warmup:]
    return {"samples_per_s": round(window["samples_per_s"], 2),  # trained only
            "wasted_tokens": {  # dropped: the window's; the workers': the whole run's
                "dropped": sum(r.figures.tokens_dropped_stale or 0 for r in measured),
                "restarted": restarted, "reprefilled": reprefilled},
            "staleness_seq": distribution(lag_counts(measured, "samples")),
            "staleness_tok": distribution(lag_counts(measured, "tokens")),
            "staleness_max": max((r.figures.lag_max or 0 for r in measured), default=0),
            "trainer_busy": round(busy / elapsed, 2),  # share of the time spent stepping
            "repack_recalls": recalls,
            "weight_reloads": reloads,  # every worker's, the whole run's
            # the machine's busy share over the measured steps (None off Linux)
            "cpu_busy": cpu.busy_share(warmup, len(every)),
            "seats_filled": fill,  # mean share of a worker's seats its engine calls used
            "worker_loop": loop,  # where worker 0's loop time went
            "tokens_per_s": round(tokens / elapsed, 1),
            # over the measured steps; a step whose groups were all dropped has no lag
            "lag_mean": round(window["lag_mean"], 2),
            "groups_dropped_stale": window["groups_dropped_stale"],
            "response_len_mean": round(sum(r.figures.response_len_mean for r in rows)
                                       / len(rows), 1)}


LOOP_LINE = re.compile(r"loop: (.*); (\d+) engine calls, ([\d.]+) of (\d+) seats each")


def worker_loops(logs: Path) -> tuple[float, str]:
    """From each worker's last loop report (RolloutWorker._report_loop): the mean share of
    its seats its engine calls filled, over all workers, and worker 0's time shares."""
    fills, first = [], ""
    for log in sorted(logs.glob("rollout-*.log")):
        found = LOOP_LINE.findall(log.read_text())
        if found:
            shares, _, filled, seats = found[-1]
            fills.append(float(filled) / int(seats))
            first = first or shares
    return (round(sum(fills) / len(fills), 2) if fills else 0.0), first


RELOAD_LINE = "now on version"  # rollout_svc.weight_refresh logs one per reload
WASTE_LINE = re.compile(r"waste: (\d+) groups restarted stale \((\d+) tokens\), (\d+) tokens "
                        r"re-prefilled")


def worker_waste(logs: Path) -> tuple[int, int]:
    """(tokens thrown away restarting stale groups, context tokens re-prefilled after a
    move), summed over the workers' closing waste lines (RolloutWorker.run)."""
    restarted = reprefilled = 0
    for log in sorted(logs.glob("rollout-*.log")):
        found = WASTE_LINE.findall(log.read_text())
        if found:
            restarted += int(found[-1][1])
            reprefilled += int(found[-1][2])
    return restarted, reprefilled


def lag_counts(rows: list[StepRecord], unit: str) -> dict[int, int]:
    """Trained samples (unit "samples") or tokens ("tokens") per lag, from the trainer's
    staleness/<unit>_lag_<bucket> histograms; the 9plus bucket counts as lag 9, and `over`
    (dropped) not at all."""
    counts: dict[int, int] = {}
    prefix = f"staleness/{unit}_lag_"
    for r in rows:
        for key, n in r.extra.items():
            if key.startswith(prefix) and key[len(prefix):] != "over" and n:
                lag = int(key[len(prefix):].removesuffix("plus"))
                counts[lag] = counts.get(lag, 0) + int(n)
    return counts


def main(argv: list[str] | None = None) -> None:
    parser = harness.parser("longtail", __doc__.split("\n\n")[0], rounds=3,
                            rounds_help="rounds of every mode; each mode reports its median run",
                            rounds_aliases=("--repeats",))
    parser.add_argument("--config", default=str(ROOT / "examples/tiny_cpu.yaml"))
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES),
                        help=f"of {', '.join(MODES)}")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the rates")
    parser.add_argument("--groups", type=int, default=8, help="prompts per trainer batch")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--median", type=int, default=16)
    parser.add_argument("--p99-ratio", type=float, default=10.0)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--segment", type=int, default=16)
    parser.add_argument("--staleness", type=int, default=2,
                        help="trainer.max_staleness of the asynchronous modes (sync: 0)")
    parser.add_argument("--inflight", type=int, default=0,
                        help="async modes: prompts out at once (scheduler.max_inflight_prompts; "
                        "0: the scheduler's own, relayrl.rules.staleness.inflight_prompts)")
    parser.add_argument("--keep-runs", default="",
                        help="keep every run's directory (metrics, logs) under this one")
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.warmup, args.rounds, args.groups = 3, 1, 1, 2
        args.max_tokens, args.median, args.modes = 32, 4, "sync,async"
    if args.rounds < 1:
        raise ValueError("--rounds: must be >= 1")
    if not 1 <= args.warmup < args.steps:
        raise ValueError("--warmup: must be in 1..steps-1")

    base = load_run_config(args.config)
    result: dict = {"bench": "longtail", "steps": args.steps, "groups": args.groups,
                    "group_size": base.buffer.group_size, "workers": args.workers,
                    "median": args.median, "p99_ratio": args.p99_ratio,
                    "staleness": args.staleness, "repeats": args.rounds}
    modes = args.modes.split(",")
    for mode in modes:
        if mode not in MODES:
            raise ValueError(f"--modes: unknown mode {mode!r}; known: {MODES}")
    runs: dict[str, list[dict]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory(prefix="relayrl-longtail-") as scratch:
        tmp = args.keep_runs or scratch
        # in rounds, every mode once a round: a machine that slows down for a while slows
        # every mode alike rather than one
        for round_ in range(args.rounds):
            for mode in modes:
                t0 = time.monotonic()
                run_dir = Path(tmp) / f"{mode}-{round_}"
                stats = run_mode(mode_config(base, mode, run_dir, args), args.warmup)
                print(f"{mode:>17}: {stats['samples_per_s']:7.2f} samples/s  "
                      f"{stats['tokens_per_s']:8.1f} tokens/s  lag {stats['lag_mean']:.2f}  "
                      f"trainer busy {stats['trainer_busy']:.0%}  "
                      f"seats filled {stats['seats_filled']:.0%}  "
                      f"cpu busy {stats['cpu_busy'] or 0:.0%}  "
                      f"({time.monotonic() - t0:.0f} s)", flush=True)
                print(f"{'':>17}  reloads {stats['weight_reloads']}, wasted tokens "
                      f"{stats['wasted_tokens']}  lag per "
                      f"sequence {stats['staleness_seq']}, per token {stats['staleness_tok']}",
                      flush=True)
                print(f"{'':>17}  worker 0: {stats['worker_loop']}", flush=True)
                runs[mode].append(stats)
    for mode, done in runs.items():  # the run with the median rate stands for the mode
        ranked = sorted(done, key=lambda st: st["samples_per_s"])
        result[mode] = {**ranked[(len(ranked) - 1) // 2],
                        "samples_per_s_runs": [st["samples_per_s"] for st in done]}
    if "sync" in result:
        for mode in MODES[1:]:
            if mode in result:
                result[f"{mode}_over_sync"] = round(
                    result[mode]["samples_per_s"] / result["sync"]["samples_per_s"], 2)
                result[f"{mode}_over_sync_by_round"] = [
                    round(a["samples_per_s"] / b["samples_per_s"], 2)
                    for a, b in zip(runs[mode], runs["sync"], strict=True)]
    result["trained_samples_per_s"] = {m: result[m]["samples_per_s"] for m in runs}
    result["staleness_max"] = {m: result[m]["staleness_max"] for m in runs}
    result["target_async_over_sync"] = 2.0
    harness.report(args, result)


if __name__ == "__main__":
    main()
