"""The separate evaluator (eval.mode separate): it evaluates its starting model as version
0, then the newest due version the relay holds, never one twice, writes eval.jsonl, goes on
after a restart where it stopped, and is planned by the launcher only when asked for."""

import threading

from eval_svc.follower import Follower, is_due
from relayrl.config import RunConfig
from relayrl.runtime.metrics import MetricsWriter, StepRecord, read_metrics
from relayrl_ops.launcher import EVALUATOR, Launcher


class FakeRelay:
    """A relay whose held versions the test moves on; pulls serve the tiny model's weights."""

    address = "fake:1"

    def __init__(self, lm, held):
        self.lm, self.held, self.pulled = lm, list(held), []

    def versions(self):
        return list(self.held)

    def pull(self, version):
        self.pulled.append(version)
        return {k: v.clone() for k, v in self.lm.model.state_dict().items()}


def config(tmp_path) -> RunConfig:
    return RunConfig.model_validate({
        "run_dir": str(tmp_path), "task": {"digits": 1, "eval_size": 3},
        "rollout": {"max_new_tokens": 2}, "trainer": {"max_steps": 6},
        "eval": {"every": 2, "mode": "separate", "poll_s": 0.01,
                 "sets": [{"name": "a", "samples": 2}, {"name": "b", "greedy": False}]}})


def test_due_versions():
    assert [v for v in range(8) if is_due(v, 3, 7)] == [0, 3, 6, 7]
    assert not [v for v in range(4) if is_due(v, 0, 3)]  # every 0: no evaluation


def test_follows_the_newest_due_version(tmp_path, tiny_lm):
    cfg = config(tmp_path)
    relay = FakeRelay(tiny_lm, [1, 2, 3])
    writer = MetricsWriter(tmp_path / "eval.jsonl")
    f = Follower(cfg.part("eval_svc"), tiny_lm, [relay], writer)
    f.evaluate(0)
    assert f.step() and relay.pulled == [2]
    assert not f.step()  # 2 is done, 3 is not due
    relay.held = [3, 4, 5, 6]  # the relay moved on during an eval: 4 is skipped for 6
    assert f.step() and relay.pulled == [2, 6] and f.finished
    writer.close()
    rows = read_metrics(tmp_path / "eval.jsonl")
    assert [r["step"] for r in rows] == [0, 2, 6]
    assert {"eval/a/pass@1", "eval/a/pass@2", "eval/a/accuracy_greedy", "eval/b/pass@1",
            "eval/accuracy_sampled", "time/eval_s"} <= set(rows[-1])
    assert "eval/b/accuracy_greedy" not in rows[-1]


def test_a_restarted_follower_goes_on_where_it_stopped(tmp_path, tiny_lm):
    cfg = config(tmp_path)
    (tmp_path / "eval.jsonl").write_text('{"step": 0}\n{"step": 4}\n')
    relay = FakeRelay(tiny_lm, [3, 4, 5, 6])
    writer = MetricsWriter(tmp_path / "eval.jsonl")
    f = Follower(cfg.part("eval_svc"), tiny_lm, [relay], writer)
    assert f.last == 4
    f.run(threading.Event())  # no second version 0; ends once max_steps is evaluated
    writer.close()
    assert relay.pulled == [6]
    assert [r["step"] for r in read_metrics(tmp_path / "eval.jsonl")] == [0, 4, 6]


def test_the_launcher_starts_an_evaluator_only_in_separate_mode(tmp_path):
    cfg = config(tmp_path)
    names = [c.name for c in Launcher(cfg)._children()]
    assert names[-1] == EVALUATOR and names.count(EVALUATOR) == 1
    inline = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"mode": "inline"})})
    assert EVALUATOR not in [c.name for c in Launcher(inline)._children()]


def test_the_plot_and_the_summary_read_eval_jsonl(tmp_path, capsys):
    from relayrl_ops.cli import _summary
    from trainer_svc.plots import plot_rewards

    (tmp_path / "metrics.jsonl").write_text("".join(
        f'{{"step": {s}, "train/reward_mean": 0.5}}\n' for s in range(1, 5)))
    (tmp_path / "eval.jsonl").write_text(
        '{"step": 0, "eval/accuracy_sampled": 0.2, "eval/accuracy_greedy": 0.3}\n'
        '{"step": 4, "eval/accuracy_sampled": 0.6}\n')  # a first set without a greedy pass
    plot_rewards(tmp_path / "metrics.jsonl", tmp_path / "reward.png")
    assert (tmp_path / "reward.png").stat().st_size > 10_000
    _summary(RunConfig(run_dir=str(tmp_path)))
    assert "held-out accuracy (sampled): 0.200 at step 0 -> 0.600 at step 4\n" in \
        capsys.readouterr().out


def test_the_plot_finds_every_sets_pass_at_1_in_order():
    from trainer_svc.plots import set_keys

    rows = [{"step": 0, "eval/heldout/pass@1": 0.1, "eval/heldout/pass@4": 0.3,
             "eval/gsm/pass@1": 0.2, "eval/accuracy_sampled": 0.1},
            {"step": 4, "eval/heldout/pass@1": 0.5, "eval/extra/pass@1": 0.4}]
    assert set_keys([StepRecord.from_json(r) for r in rows]) == [
        "eval/heldout/pass@1", "eval/gsm/pass@1", "eval/extra/pass@1"]
