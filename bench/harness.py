"""What every benchmark's main() runs through: one argument parser and one way to end a run.

    from bench import harness

    def main(argv=None):
        parser = harness.parser("throughput", __doc__.splitlines()[0], rounds=1)
        parser.add_argument("--config", default="examples/tiny_cpu.yaml")  # its own flags
        args = parser.parse_args(argv)
        ...
        harness.report(args, {"bench": "throughput", "samples_per_s": ...})

Every bench takes

    --smoke         its real path at the smallest size, in seconds (the smoke test's mode)
    --rounds N      how many times it repeats its measurement, for a bench that repeats one
    --results PATH  the file its results line is appended to (bench/results/<name>.jsonl)

`report` prints the record as the run's last stdout line, one JSON dict, and appends it to
the results file together with what it takes to reproduce and compare it: the command, the
commit (with "+dirty" when a tracked file other than a bench's output differs from it), the
UTC date and the machine. A results file only grows, so it is the bench's history. `skip`
ends a smoke run that cannot take its real path here (no GPU, no benches' venv) the same
way, with the reason.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
OUTPUTS = ("bench/results", "docs/results")  # what benches write, relative to ROOT
DOCS_RESULTS = ROOT / "docs" / "results"


class _Parser(argparse.ArgumentParser):
    # The argv goes on the namespace, so a results line names the command as it was run,
    # also when a test calls main(argv) rather than a shell calling the script.
    def parse_args(self, args=None, namespace=None):
        argv = sys.argv[1:] if args is None else [str(a) for a in args]
        ns = super().parse_args(argv, namespace)
        ns.command = shlex.join(["python", f"bench/{ns.bench_name}.py", *argv])
        return ns


def parser(name: str, description: str | None = None, *, rounds: int | None = None,
           rounds_help: str = "times the measurement is repeated",
           rounds_aliases: tuple[str, ...] = (),
           smoke_help: str = "the real path at the smallest size, for the smoke test",
           ) -> argparse.ArgumentParser:
    """The parser of bench/<name>.py with the common flags; the bench adds its own. `rounds`
    is the default of --rounds; a bench that repeats nothing leaves it None and has no such
    flag (one it would ignore). `rounds_aliases`: the bench's older name for the same flag."""
    p = _Parser(prog=f"bench/{name}.py", description=description,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(bench_name=name)
    p.add_argument("--smoke", action="store_true", help=smoke_help)
    p.add_argument("--results", type=Path, default=RESULTS / f"{name}.jsonl",
                   help="append the results line here (default: %(default)s)")
    if rounds is not None:
        p.add_argument("--rounds", *rounds_aliases, type=int, default=rounds, help=rounds_help)
    return p


def report(args: argparse.Namespace, record: dict, picture: Path | None = None) -> None:
    """End a run: `record` appended to the results file with its provenance, then printed as
    the last stdout line. `picture`: what the bench drew of this run; one under docs/results/
    is named in the record (relative to that folder), so the run's results page shows it."""
    if picture is not None and Path(picture).resolve().is_relative_to(DOCS_RESULTS):
        record = {**record, "picture": str(Path(picture).resolve().relative_to(DOCS_RESULTS))}
    line = {"bench": args.bench_name, **record, "command": args.command, "commit": commit(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": machine()}
    path = Path(args.results)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(line) + "\n")
    print(json.dumps(record), flush=True)


def skip(args: argparse.Namespace, reason: str) -> None:
    """End a --smoke run that cannot take the real path on this machine: nothing is measured
    in its place, the reason is the record, and the exit status is 0."""
    report(args, {"bench": args.bench_name, "smoke": "skipped", "reason": reason})
    raise SystemExit(0)


def commit() -> str:
    try:
        head = _git("rev-parse", "HEAD")
        # tracked files only, and none of what benches write (their records and pictures):
        # benches run one after another in one tree, and an earlier one's output is no change
        # to what a later one measures
        dirty = _git("status", "--porcelain", "--untracked-files=no", "--", ".",
                     *(f":(exclude){p}" for p in OUTPUTS))
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                          check=True, timeout=30).stdout.strip()


def machine() -> dict:
    """What a figure depends on, without naming the host: two runs on like machines compare."""
    facts = {"platform": platform.platform(), "python": platform.python_version(),
             "cpus": os.cpu_count(), "cpu": _cpu_model(), "torch": None, "cuda": None}
    try:
        import torch
    except ImportError:
        return facts
    facts["torch"] = torch.__version__
    if torch.cuda.is_available():
        facts["cuda"] = torch.cuda.get_device_name(0)
    return facts


def _cpu_model() -> str:
    try:
        for row in Path("/proc/cpuinfo").read_text().splitlines():
            if row.startswith("model name"):
                return row.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
