"""The shipped GPU plans (examples/gpu/), process by process: the node, the GPUs each process
is given (CUDA_VISIBLE_DEVICES, empty for a process that needs none), the exact command line
(the trainer on several GPUs under torchrun) and ports; each process, parsing the run's
config with its own overrides, serves where the plan says; the launcher forks exactly that;
a GPU filled past its memory fails `relayrl check`; an unplaced run sets nothing."""

import sys
from pathlib import Path

import pytest

from relayrl.config import RunConfig, load_run_config
from relayrl_ops.check import Report, _placement
from relayrl_ops.launcher import PUBLISH_PARTIES, Launcher
from relayrl_ops.memory_plan import gpu_loads, gpu_memory
from relayrl_ops.plan import on_node, plan

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


def example(name: str) -> RunConfig:
    return load_run_config(ROOT / "examples" / "gpu" / name)


def table(cfg: RunConfig) -> list[tuple]:
    """(name, node, env, argv after the config, ports) of every process."""
    config = f"{cfg.run_dir}/config.yaml"
    rows = []
    for p in plan(cfg):
        argv = p.argv(config)
        cut = argv.index(config)
        assert argv[cut - 1] == "--config"
        rows.append((p.name, p.node, p.env, argv[:cut - 1], argv[cut + 1:], p.ports))
    return rows


def python_m(module: str) -> list[str]:
    return [PY, "-m", module]


def test_one_gpu_shared_by_the_trainer_the_relay_and_one_vllm_worker():
    cfg = example("one_gpu.yaml")
    assert table(cfg) == [
        ("relay", 0, {"CUDA_VISIBLE_DEVICES": "0"}, python_m("relay_svc"), [],
         {"relay.endpoint.port": 50551}),
        ("scheduler", 0, {"CUDA_VISIBLE_DEVICES": ""}, python_m("scheduler_svc"), [],
         {"scheduler.endpoint.port": 50552}),
        ("buffer", 0, {"CUDA_VISIBLE_DEVICES": ""}, python_m("buffer_svc"), [],
         {"buffer.endpoint.port": 50553}),
        ("trainer", 0, {"CUDA_VISIBLE_DEVICES": "0"}, python_m("trainer_svc"), [],
         {"trainer.endpoint.port": 50554}),
        ("rollout-0", 0, {"CUDA_VISIBLE_DEVICES": "0"}, python_m("rollout_svc"),
         ["--set", "rollout.worker_index=0"], {"rollout.base_port+0": 50560}),
    ]
    assert cfg.vllm_transfer(0) == "ipc"  # the relay's GPU


def test_eight_gpus_give_the_trainer_four_torchrun_ranks_and_each_worker_its_own():
    rows = table(example("eight_gpus.yaml"))
    names = [r[0] for r in rows]
    assert names == ["relay", "scheduler", "buffer", "trainer", "rollout-0", "rollout-1",
                     "rollout-2", "rollout-3", "evaluator"]
    trainer = rows[3]
    assert trainer == (
        "trainer", 0, {"CUDA_VISIBLE_DEVICES": "0,1,2,3"},
        [PY, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "4",
         "--master-addr", "127.0.0.1", "--master-port", "29500", "-m", "trainer_svc"], [],
        {"trainer.endpoint.port": 50554, "resources.torchrun_port": 29500})
    for i, row in enumerate(rows[4:8]):
        assert row == (f"rollout-{i}", 0, {"CUDA_VISIBLE_DEVICES": str(4 + i)},
                       python_m("rollout_svc"), ["--set", f"rollout.worker_index={i}"],
                       {f"rollout.base_port+{i}": 50560 + i})
    assert rows[8] == ("evaluator", 0, {"CUDA_VISIBLE_DEVICES": "7"}, python_m("eval_svc"),
                       [], {})
    assert rows[0][2] == {"CUDA_VISIBLE_DEVICES": "4"}  # the relay's copy, beside worker 0
    assert all(r[2] == {"CUDA_VISIBLE_DEVICES": ""} for r in rows[1:3])
    cfg = example("eight_gpus.yaml")
    assert [cfg.vllm_transfer(i) for i in range(4)] == ["ipc", "nccl", "nccl", "nccl"]


def test_two_nodes_split_the_run_and_each_node_starts_its_own_share():
    cfg = example("two_nodes.yaml")
    rows = {r[0]: r for r in table(cfg)}
    assert rows["trainer"][3][-1] == "trainer_svc"
    assert rows["trainer"][2] == {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    assert "--nproc-per-node" in rows["trainer"][3] and "8" in rows["trainer"][3]
    assert rows["relay-child-0"] == (
        "relay-child-0", 1, {"CUDA_VISIBLE_DEVICES": "0"}, python_m("relay_svc"),
        ["--set", "relay.endpoint.host=10.0.0.2", "--set", "relay.endpoint.port=50540",
         "--set", "relay.upstream=['10.0.0.1:50551']", "--set", "relay.children=0",
         "--set", "relay.metrics_port=0", "--set", "resources.relay_children=[]"],
        {"relay.children_base_port+0": 50540})
    for i in range(8):  # registered with the scheduler at their node's address
        assert rows[f"rollout-{i}"] == (
            f"rollout-{i}", 1, {"CUDA_VISIBLE_DEVICES": str(i)}, python_m("rollout_svc"),
            ["--set", f"rollout.worker_index={i}", "--set", "rollout.host=10.0.0.2"],
            {f"rollout.base_port+{i}": 50560 + i})
    assert [cfg.vllm_transfer(i) for i in range(8)] == ["ipc"] + ["nccl"] * 7
    processes = plan(cfg)
    assert [p.name for p in on_node(processes, 0)] == ["relay", "scheduler", "buffer",
                                                        "trainer"]
    assert [p.name for p in on_node(processes, 1)] == [
        "relay-child-0", *(f"rollout-{i}" for i in range(8)), "evaluator"]


@pytest.mark.parametrize("name", ["one_gpu.yaml", "eight_gpus.yaml", "two_nodes.yaml"])
def test_each_process_serves_where_the_plan_says(tmp_path, name):
    cfg = example(name)
    path = tmp_path / "config.yaml"
    path.write_text((ROOT / "examples" / "gpu" / name).read_text())
    for p in plan(cfg):
        own = load_run_config(path, list(p.overrides))  # what the process parses
        section = {"relay_svc": own.relay, "scheduler_svc": own.scheduler,
                   "buffer_svc": own.buffer, "trainer_svc": own.trainer,
                   "rollout_svc": own.rollout, "eval_svc": None}[p.module]
        if section is None:
            assert p.address == ""
            continue
        assert section.endpoint.address == p.address, p.name
        assert section.endpoint.port in p.ports.values(), p.name
        if p.module == "rollout_svc":
            assert own.rollout.worker_id == p.name


class RecordingZygote:
    """Stands in for the zygote: records what the launcher asks it to fork."""

    def __init__(self):
        self.spawned = []

    def alive(self):
        return True

    def spawn(self, name, module, argv, env, log, stderr_to_log):
        self.spawned.append((name, module, argv, env))


def test_the_launcher_forks_each_process_of_its_node_with_its_gpus(tmp_path):
    cfg = example("eight_gpus.yaml").model_copy(update={"run_dir": str(tmp_path)})
    launcher = Launcher(cfg)
    launcher.zygote = RecordingZygote()
    for child in launcher._children():
        launcher._spawn(child)
    config = str(tmp_path / "config.yaml")
    by_name = {name: (module, argv, env) for name, module, argv, env
               in launcher.zygote.spawned}
    assert list(by_name) == [p.name for p in plan(cfg)]
    module, argv, env = by_name["trainer"]
    assert module == "torch.distributed.run" and env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert argv[argv.index("-m") + 1:] == ["trainer_svc", "--config", config]
    for name, (_, _, env) in by_name.items():
        assert "CUDA_VISIBLE_DEVICES" in env, name
        holds_trainer_token = cfg.auth.trainer_token_env in env
        assert holds_trainer_token <= (name in PUBLISH_PARTIES), name
    assert by_name["rollout-2"][2]["CUDA_VISIBLE_DEVICES"] == "6"


def test_a_node_starts_nothing_of_another_node(tmp_path):
    cfg = example("two_nodes.yaml").model_copy(update={"run_dir": str(tmp_path)})
    assert [c.name for c in Launcher(cfg, node=1)._children()][:2] == ["relay-child-0",
                                                                       "rollout-0"]
    assert "trainer" not in [c.name for c in Launcher(cfg, node=1)._children()]


def test_cpu_workers_each_go_to_the_node_their_entry_names():
    """A resources.rollout entry without GPUs is one worker on that node's CPU, served and
    registered at the node's address."""
    cfg = RunConfig.model_validate({
        "auth": {"plaintext_beyond_loopback": True}, "redis": {"url": "redis://10.0.0.1:6379"},
        "resources": {"nodes": [{"address": "10.0.0.1"}, {"address": "10.0.0.2"},
                                {"address": "10.0.0.3"}],
                      "rollout": [{"node": 1}, {"node": 2}]},
        **{name: {"endpoint": {"host": "10.0.0.1", "port": 50551 + i}}
           for i, name in enumerate(("relay", "scheduler", "buffer", "trainer"))},
        "rollout": {"num_workers": 2, "base_port": 50560}})
    workers = {p.name: p for p in plan(cfg) if p.module == "rollout_svc"}
    assert [(p.node, p.gpus, p.address) for p in workers.values()] == [
        (1, (), "10.0.0.2:50560"), (2, (), "10.0.0.3:50561")]
    assert workers["rollout-1"].overrides == ("rollout.worker_index=1", "rollout.host=10.0.0.3")
    assert [p.name for p in on_node(plan(cfg), 2)] == ["rollout-1"]


def test_an_unplaced_run_leaves_every_gpu_visible():
    cfg = RunConfig()
    assert all(p.env == {} and p.gpus is None for p in plan(cfg))
    lines = []
    _placement(cfg, Report(lines.append), None)
    assert lines == ["placement: none (no resources section): every process sees every GPU "
                     "of its machine, and CUDA gives each cuda:0"]


GIB = 1 << 30


def test_a_gpu_filled_past_its_memory_fails_the_check():
    cfg = example("one_gpu.yaml")
    cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={
        "engine": cfg.rollout.engine.model_copy(update={"kv_cache_gib": 78.0})})})
    rows = [("trainer", 1, [("float32 weights", 2 * GIB), ("two publish snapshots", 9 * GIB)]),
            ("relay", 1, [("2 versions (relay.keep_versions)", GIB)]),
            ("rollout worker", 1, [("bfloat16 weights", GIB), ("KV cache", 78 * GIB)])]
    processes = plan(cfg)
    held = gpu_memory(cfg, rows, processes)
    assert held["trainer"] == 2 * GIB  # the snapshots are pinned host memory
    buffers = 512 << 20  # the vllm plane's packed transfer buffers
    assert held["rollout-0"] == GIB + 78 * GIB + GIB + buffers  # weights, KV, headroom
    assert held["relay"] == GIB + buffers  # its kept versions' copies on the GPU
    assert gpu_loads(cfg, processes, held)[(0, 0)] == (
        84 * GIB, ["relay", "trainer", "rollout-0"])
    lines = []
    report = Report(lines.append)
    _placement(cfg, report, rows)
    assert report.failed == 1
    assert lines[-1] == ("  FAILED placement: node 0 GPU 0: 84.00 of 80.00 GiB (relay, "
                         "trainer, rollout-0): more than the GPU holds "
                         "(resources.nodes[0].gpu_memory_gib)")
