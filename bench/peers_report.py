"""bench/peers.py's arithmetic and report, free of services: each run's held-out curve
(seconds, pass@1), smoothed by a trailing mean of SMOOTH saves, so a level is reached only
when the curve stays near it; the levels, the start plus LEVELS of the way to TRL's final
accuracy (the median over TRL's rounds of each run's mean over its last SMOOTH saves, up
to the level step when the sides ran past it); each side's median and spread of the time to
each level, and TRL time / RelayRL time. Per step,
whatever either side's speed: each round's pass@1 at each saved step, and the difference of
the sides' means over every save with its standard error over rounds (learning per step).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from bench.convergence_curves import first_reach, trailing_mean

SMOOTH = 3
LEVELS = (0.5, 0.75, 0.9, 1.0)
SIDES = ("relayrl", "trl")


@dataclass(frozen=True)
class Run:
    side: str
    curve: list[tuple[float, float]]  # (seconds since the command started, pass@1); (0, start)
    steps: list[int]  # the optimizer step of each point of the curve; 0 for the start
    samples: int  # trained by the last save
    seconds: float  # of the last save

    def smoothed(self) -> list[float]:
        return trailing_mean([acc for _, acc in self.curve], SMOOTH)

    def final(self, until: int | None = None) -> float:
        """The mean of the last SMOOTH saves, of those up to step `until` if given."""
        accs = [acc for step, (_, acc) in zip(self.steps, self.curve, strict=True)
                if until is None or step <= until]
        return statistics.fmean(accs[-SMOOTH:])

    def time_to(self, level: float) -> float | None:
        # the tolerance keeps a mean that equals the level from missing it by rounding
        return first_reach([t for t, _ in self.curve], self.smoothed(), level - 1e-9)


def spread(values: list[float | None]) -> dict:
    """Median, least and most of the rounds; a round that never got there makes the median
    None once it is half of them."""
    got = sorted(v for v in values if v is not None)
    missed = len(values) - len(got)
    median = (statistics.median(got + [float("inf")] * missed) if got else None)
    return {"median": None if median in (None, float("inf")) else round(median, 1),
            "min": round(got[0], 1) if got else None,
            "max": None if missed or not got else round(got[-1], 1), "missed": missed}


def summarize(runs: list[Run], start: float, until: int | None = None) -> dict:
    """`until`: the step whose saves set the levels (TRL's final accuracy there), where both
    sides ran past it so that a round that gets there late is timed rather than missed; the
    final pass@1 reported is each side's there too. None: each run's last save."""
    by_side = {side: [r for r in runs if r.side == side] for side in SIDES}
    if not all(by_side.values()):
        raise ValueError(f"need runs of both sides, got {sorted({r.side for r in runs})}")
    target = statistics.median(r.final(until) for r in by_side["trl"])
    levels = [round(start + f * (target - start), 4) for f in LEVELS]
    sides = {}
    for side, rs in by_side.items():
        sides[side] = {
            "final_pass@1": round(statistics.median(r.final(until) for r in rs), 4),
            "samples_per_s": round(statistics.median(r.samples / r.seconds for r in rs), 1),
            "seconds": round(statistics.median(r.seconds for r in rs), 1),
            "time_to": [spread([r.time_to(level) for r in rs]) for level in levels]}
    ratios = []
    for i in range(len(levels)):
        trl, ours = (sides[s]["time_to"][i]["median"] for s in ("trl", "relayrl"))
        ratios.append(None if trl is None or ours is None else round(trl / ours, 2))
    return {"start_pass@1": round(start, 4), "levels": levels, "fractions": list(LEVELS),
            "level_step": until, "sides": sides, "trl_over_relayrl": ratios,
            "per_step": per_step(by_side)}


def per_step(by_side: dict[str, list[Run]]) -> dict:
    """Each round's pass@1 at the steps every run saved, and RelayRL's mean over those saves
    minus TRL's, with the standard error of that difference over rounds (None with fewer
    than two rounds a side)."""
    steps = sorted(set.intersection(*(set(r.steps[1:]) for rs in by_side.values()
                                      for r in rs)))
    rounds = {side: [[dict(zip(r.steps, (a for _, a in r.curve), strict=True))[s]
                      for s in steps] for r in rs] for side, rs in by_side.items()}
    if not steps:
        return {"steps": steps, "rounds": rounds, "gap": None, "gap_se": None}
    means = {side: [statistics.fmean(accs) for accs in rs] for side, rs in rounds.items()}
    gap = statistics.fmean(means["relayrl"]) - statistics.fmean(means["trl"])
    enough = all(len(m) > 1 for m in means.values())
    se = (sum(statistics.variance(m) / len(m) for m in means.values()) ** 0.5
          if enough else None)
    return {"steps": steps, "rounds": rounds, "gap": round(gap, 4),
            "gap_se": None if se is None else round(se, 4)}


def _cell(s: dict) -> str:
    if s["median"] is None:
        return f"not reached ({s['missed']} rounds)"
    hi = "not reached" if s["max"] is None else f"{s['max']:.0f}"
    return f"{s['median']:.0f} s ({s['min']:.0f}-{hi})"


def markdown(report: dict, setup: str, config: str, trl_version: str, command: str,
             png: str) -> str:
    levels = report["levels"]
    head = " | ".join(f"to {lv:.3f} ({int(100 * f)}%)"
                      for lv, f in zip(levels, report["fractions"], strict=True))
    lines = [f"# RelayRL against TRL {trl_version} on one machine: `{setup}`", "",
             f"Written by `{command}`; rerun it rather than editing this file. Config: "
             f"`{config}`; the warm start's held-out pass@1 is {report['start_pass@1']:.3f}.",
             "", f"| side | final pass@1 | samples/s | {head} |",
             "|---|---|---|" + "---|" * len(levels)]
    for side, s in report["sides"].items():
        cells = " | ".join(_cell(t) for t in s["time_to"])
        lines.append(f"| {side} | {s['final_pass@1']:.3f} | {s['samples_per_s']} | {cells} |")
    ratios = " | ".join("-" if r is None else f"{r:.2f}" for r in report["trl_over_relayrl"])
    lines += [f"| TRL time / RelayRL time | | | {ratios} |", "",
              "- Levels: the start plus 50/75/90/100% of the way to TRL's final held-out "
              "pass@1 (median over its rounds of each run's mean over its last 3 saves"
              + ("" if report.get("level_step") is None else
                 f" up to step {report['level_step']}; both sides ran on past it, so a round "
                 "that reaches a level late is timed, not missed; final pass@1 is at that "
                 "step too") + ").",
              "- Times: seconds since the side's command started, to the first save at which "
              "the trailing mean of 3 saves reaches the level; median over rounds (fastest-"
              "slowest). Above 1 in the last row: RelayRL got there first.",
              "- Every saved policy is evaluated offline by relayrl's evaluator on the same "
              "held-out set with the same seed, so evaluation costs neither side time.", "",
              f"![held-out accuracy against seconds]({png})", ""]
    return "\n".join(lines + per_step_markdown(report["per_step"]))


def per_step_markdown(ps: dict) -> list[str]:
    if not ps["steps"]:
        return []
    lines = ["## Per step", "",
             "Held-out pass@1 of each saved policy: the mean of the rounds (each round).", "",
             "| step | " + " | ".join(str(s) for s in ps["steps"]) + " |",
             "|---|" + "---|" * len(ps["steps"])]
    for side, rounds in ps["rounds"].items():
        cells = [f"{statistics.fmean(col):.2f} ({' / '.join(f'{a:.2f}' for a in col)})"
                 for col in zip(*rounds, strict=True)]
        lines.append(f"| {side} | " + " | ".join(cells) + " |")
    se = "" if ps["gap_se"] is None else f" +- {ps['gap_se']:.3f} (standard error over rounds)"
    return lines + ["", f"Mean over these saves, RelayRL minus TRL: {ps['gap']:+.3f}{se}.", ""]


def plot(runs: list[Run], report: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    colors = {"relayrl": "tab:blue", "trl": "tab:orange"}
    for side in SIDES:
        for i, r in enumerate(x for x in runs if x.side == side):
            ax.plot([t for t, _ in r.curve], r.smoothed(), color=colors[side], alpha=0.8,
                    label=side if i == 0 else None)
    ax.axhline(report["levels"][-1], color="grey", ls="--", lw=1, label="TRL's final")
    ax.set(xlabel="seconds since the command started", ylabel="held-out pass@1 (smoothed)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
