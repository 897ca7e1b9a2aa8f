"""What the cluster simulator says at fleet scale: trained samples/s of every asynchronous mode
against synchronous training at each fleet size, on the same seeded heavy-tailed workload.

    python bench/scale.py                               # 64, 128 and 1024 workers
    python bench/scale.py --workers 64,1024 --sensitivity   # and each cost x0.5, x2 at 1024
    python bench/scale.py --costs runs/sim/costs.json   # costs from bench/calibrate_sim.py

`relayrl simulate` (relayrl_sim) models N generation workers and one trainer as discrete
events, under the services' own staleness, start and repacking rules (relayrl/rules). The
simulator's model, its costs and their sources are in docs/guides/simulator.md. The ratio of
each mode to sync is measured in the same run on the same workload; only what the trainer
trains counts. With --sensitivity, every cost is also halved and doubled in turn at the
largest fleet size, and the record says which orderings survive every variant. Draws
docs/results/scale.png (throughput, speedup and utilization against fleet size).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from relayrl_sim import sensitivity, sweep  # noqa: E402
from relayrl_sim.engine import MODES  # noqa: E402
from relayrl_sim.report import format_table, plot, summary  # noqa: E402

SMOKE = {"workers": "4,8", "steps": 6, "warmup": 2}


def main(argv: list[str] | None = None) -> None:
    parser = harness.parser("scale", __doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="64,128,1024", help="fleet sizes")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--config", help="a simulator config (YAML), as relayrl simulate takes")
    parser.add_argument("--costs", help="a costs file from bench/calibrate_sim.py")
    parser.add_argument("--steps", type=int, help="trainer steps simulated (default: the "
                        "config's)")
    parser.add_argument("--warmup", type=int, help="steps left out of the measured window")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--sensitivity", action="store_true",
                        help="also every cost x0.5 and x2 at the largest fleet size")
    parser.add_argument("--jobs", type=int, default=2, help="simulations run at once")
    parser.add_argument("--out", default=str(ROOT / "docs" / "results"),
                        help="where scale.png goes")
    args = parser.parse_args(argv)
    if args.smoke:
        args.workers = SMOKE["workers"]
        args.steps, args.warmup = SMOKE["steps"], SMOKE["warmup"]
        args.out = str(ROOT / "runs" / "scale_smoke")
    try:
        cfg = sweep.build_config(args.config, args.costs, None, args.seed, args.steps,
                                 args.warmup)
        workers = sweep.parse_list(args.workers, "workers", int)
        modes = sweep.parse_list(args.modes, "modes", str)
    except ValueError as err:
        parser.error(str(err))
    results = sweep.run_grid(cfg, workers, modes, args.jobs, lambda r: print(
        f"[{r.workers:>5} workers] {r.mode:<13} {r.trained_samples_per_s:>9.1f} trained/s  "
        f"util {r.utilization:.2f}", flush=True))
    print(format_table(results))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    png = out / "scale.png"
    plot(results, png, title=f"responses: {cfg.workload.response.describe()}; "
         f"{cfg.steps} trainer steps")
    record = {"bench": "scale", "workload": cfg.workload.response.describe(),
              "steps": cfg.steps, "costs": args.costs or "default", **summary(results)}
    if args.sensitivity:
        rows = sensitivity.run(cfg, max(workers), modes, args.jobs)
        print(sensitivity.format_table(rows))
        record["sensitivity"] = {"workers": max(workers), "rows": rows,
                                 "surviving": sensitivity.surviving(rows)}
    harness.report(args, record, picture=png)


if __name__ == "__main__":
    main()
