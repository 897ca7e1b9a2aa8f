"""bench/harness.py: the common flags, and a run's record printed and appended to its results
file with the command, commit, date and machine."""

import datetime
import json

import pytest

from bench import harness


def test_the_common_flags_and_a_benchs_own():
    parser = harness.parser("demo", "a bench", rounds=3, rounds_aliases=("--repeats",))
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args(["--steps", "4", "--repeats", "2"])
    assert (args.smoke, args.rounds, args.steps) == (False, 2, 4)
    assert args.results == harness.ROOT / "bench" / "results" / "demo.jsonl"
    assert args.command == "python bench/demo.py --steps 4 --repeats 2"
    assert harness.parser("demo", rounds=3).parse_args([]).rounds == 3
    with pytest.raises(SystemExit):  # a bench that repeats nothing takes no --rounds
        harness.parser("demo").parse_args(["--rounds", "2"])


def test_report_prints_the_record_and_appends_it_with_its_provenance(tmp_path, capsys):
    results = tmp_path / "deep" / "demo.jsonl"
    args = harness.parser("demo", rounds=1).parse_args(["--smoke", "--results", str(results)])
    harness.report(args, {"bench": "demo", "samples_per_s": 1.5})
    harness.report(args, {"bench": "demo", "samples_per_s": 2.5})
    printed = capsys.readouterr().out.strip().splitlines()
    assert json.loads(printed[-1]) == {"bench": "demo", "samples_per_s": 2.5}
    first, second = [json.loads(row) for row in results.read_text().splitlines()]
    assert first["samples_per_s"] == 1.5 and second["samples_per_s"] == 2.5  # appended
    assert second["command"] == f"python bench/demo.py --smoke --results {results}"
    assert second["commit"].split("+")[0] == harness._git("rev-parse", "HEAD")
    date = datetime.datetime.fromisoformat(second["date"])
    assert date.utcoffset() == datetime.timedelta(0)
    assert {"platform", "python", "cpus", "torch", "cuda"} <= second["machine"].keys()


def test_the_commit_is_unknown_without_git(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no git on it
    assert harness.commit() == "unknown"


def test_skip_reports_the_reason_and_exits_0(tmp_path, capsys):
    args = harness.parser("demo").parse_args(["--smoke", "--results", str(tmp_path / "r")])
    with pytest.raises(SystemExit) as exit_:
        harness.skip(args, "no GPU here")
    assert exit_.value.code == 0
    record = {"bench": "demo", "smoke": "skipped", "reason": "no GPU here"}
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == record
    assert json.loads((tmp_path / "r").read_text())["reason"] == "no GPU here"
