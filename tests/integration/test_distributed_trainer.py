"""Two CPU processes under torchrun (gloo; FSDP2, and replicated weights) train as one
process does: three optimizer steps on a fixed batch end at the same weights, with the same
loss and gradient norm at every step, through a gather-and-restore of the whole training
state; the service's trainer, checkpointing and resuming, ends where one process does; a
follower outlives a rank 0 that waits several process-group timeouts between steps; each
rank, reading only its shard of the weights, holds the weights one process loads, bit for
bit; and under bf16 FSDP2 gathers parameters in bfloat16 and reduces gradients in float32,
its step close to one process's."""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from relayrl.runtime.redis_conn import EmbeddedRedis
from relayrl_torch.models.loading import load_model
from tests.conftest import free_ports
from tests.integration.distributed_worker import (
    IDLE_S,
    IDLE_TIMEOUT_S,
    SCENARIOS,
    mixed_precision_step,
    run_after_idling,
    run_scenario,
    run_service_trainer,
)
from trainer_svc import checkpoint
from trainer_svc.distributed import World

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"))
    yield server.url
    server.shutdown()


def torchrun(*args: str) -> None:
    """`torchrun -m tests.integration.distributed_worker ARGS` on two ranks; fails the test
    with the ranks' output unless both end well."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", str(free_ports(1)[0]), "-m", "tests.integration.distributed_worker",
           *args]
    # its own session: on a timeout the ranks go too, not only torchrun (a hung collective
    # would otherwise keep both ranks alive long after the test)
    # a rank that dies on a signal prints every thread's Python stack (faulthandler); no
    # progress bars to crowd it out of the failure message
    env = {**os.environ, "PYTHONFAULTHANDLER": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env=env)
    try:
        stdout, stderr = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail("torchrun ran over 300 s:\n" + stdout[-4000:] + stderr[-4000:])
    assert proc.returncode == 0, stdout[-4000:] + stderr[-12000:]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, tiny_lm, redis_url):
    """Rank 0's results of every scenario, trained by two gloo processes."""
    tmp = tmp_path_factory.mktemp("ranks")
    out = tmp / "ranks.pt"
    torchrun("scenarios", str(tiny_lm.path), str(out), redis_url, str(tmp / "run"))
    return {"runs": torch.load(out, weights_only=True), "run_dir": tmp / "run"}


# Adam moves a weight by about lr a step whatever its gradient's size, so where a gradient
# is near zero the float rounding of two ways of summing it becomes part of the step: the
# weights agree to a hundredth of how far the three steps at lr 1e-2 can move one (a few
# such weights differ by 1e-4), not to float precision. A wrong gradient moves most
# weights by a step's size.
WEIGHT_ATOL = 3 * 1e-2 / 100


def assert_same_weights(two: dict, one: dict) -> None:
    assert sorted(two) == sorted(one)
    for key in one:
        torch.testing.assert_close(two[key], one[key], atol=WEIGHT_ATOL, rtol=0, msg=key)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_two_ranks_train_like_one_process(two_ranks, tiny_lm, name):
    one = run_scenario(name, str(tiny_lm.path), World())
    two = two_ranks["runs"][name]
    assert_same_weights(two["weights"], one["weights"])
    torch.testing.assert_close(two["old_logprobs"], one["old_logprobs"], atol=1e-6, rtol=0)
    for key, state in one["objective"].items():  # PPO's value head
        assert_same_weights(two["objective"][key], state)
    for step, (step_two, step_one) in enumerate(zip(two["stats"], one["stats"], strict=True)):
        # the first step's from the same weights; the later ones' from weights that agree
        # to WEIGHT_ATOL
        rel, abs_ = (1e-5, 1e-7) if step == 0 else (1e-3, 1e-6)
        for key in ("loss", "grad_norm", "policy_loss"):
            assert step_two[key] == pytest.approx(step_one[key], rel=rel, abs=abs_,
                                                  nan_ok=True), (step, key)
    # a step whose loss is not finite is skipped on every rank alike (trainer_svc.finite)
    assert two["nonfinite"] == one["nonfinite"] == ["nonfinite" in name, False, False]
    moved = [k for k, v in one["weights"].items()
             if not torch.equal(v, dict(tiny_lm.model.named_parameters()).get(k, v))]
    assert moved, "the steps left every weight where it was"


def test_the_service_trainer_checkpoints_and_resumes_like_one_process(two_ranks, tiny_lm,
                                                                       redis_url, tmp_path):
    one = run_service_trainer(str(tiny_lm.path), redis_url, str(tmp_path / "run"), World())
    assert_same_weights(two_ranks["runs"]["service"], one)
    ckpt = two_ranks["run_dir"] / "checkpoints" / "step_00000002"
    config = json.loads((ckpt / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]  # not FSDP's wrapper class
    state = checkpoint.load_state(ckpt)
    assert state["optimizer_by_name"]
    assert "value_head" in state["extra"]["objective"]


def test_a_follower_outlives_a_rank_0_idle_for_several_timeouts(tiny_lm, tmp_path):
    """Rank 0 waits IDLE_S, three times the process group's timeout, before each of two steps,
    as a trainer waiting for batches does; the follower, which waits inside a collective
    meanwhile, is kept from the timeout by rank 0's idle operations, and the steps are one
    process's."""
    assert IDLE_S >= 3 * IDLE_TIMEOUT_S
    out = tmp_path / "idle.pt"
    torchrun("idle", str(tiny_lm.path), str(out))
    two = torch.load(out, weights_only=True)
    one = run_after_idling(str(tiny_lm.path), World(), idle_s=0)
    assert_same_weights(two["weights"], one["weights"])
    for step_two, step_one in zip(two["stats"], one["stats"], strict=True):
        assert step_two["loss"] == pytest.approx(step_one["loss"], rel=1e-3, abs=1e-6)


@pytest.fixture(scope="module")
def base_names_dir(tiny_lm, tmp_path_factory):
    """The tiny model's directory with its weights under the base model's names (no `model.`
    prefix), as a checkpoint of the decoder alone is: transformers adds the prefix as it
    loads, so only a whole load reads it."""
    from safetensors.torch import load_file, save_file

    out = tmp_path_factory.mktemp("base_names")
    for f in tiny_lm.path.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, out / f.name)
    state = load_file(tiny_lm.path / "model.safetensors")
    save_file({k.removeprefix("model."): v for k, v in state.items()},
              out / "model.safetensors", metadata={"format": "pt"})
    return out


def test_every_rank_reads_its_shard_and_holds_what_one_process_loads(tiny_lm, base_names_dir,
                                                                      tmp_path):
    """Built on the meta device and sharded, each rank reads its own slices of the safetensors
    (or, from files under other names, gets them from rank 0's whole load); the gathered
    weights of the policy and of the KL reference equal one process's load bit for bit, every
    rank's rotary frequencies (a buffer no checkpoint holds) are one process's, and under
    FSDP2 each rank holds a share of every sharded tensor, the shares adding up to it."""
    out = tmp_path / "load.pt"
    torchrun("load", str(tiny_lm.path), str(out), str(base_names_dir))
    runs = torch.load(out, weights_only=True)
    assert runs["sharded"]["stored"] and runs["replicated"]["stored"]
    assert not runs["base_names"]["stored"]
    one = load_model(tiny_lm.path).model
    whole = one.state_dict()
    buffers = dict(one.named_buffers())
    assert "model.rotary_emb.inv_freq" in buffers
    for name, run in runs.items():
        for module in ("policy", "reference"):
            assert sorted(run[module]) == sorted(whole), (name, module)
            for key, value in whole.items():
                assert torch.equal(run[module][key], value), (name, module, key)
            for rank in run["ranks"]:
                held = rank[module]
                assert held["devices"] == {"cpu"}
                assert sorted(held["buffers"]) == sorted(buffers)
                for key, value in buffers.items():
                    assert torch.equal(held["buffers"][key], value), (name, module, key)
                assert all(held["sharded"]) == (name != "replicated"), (name, module)
        if name == "replicated":
            continue
        for key, value in whole.items():
            shares = [rank["policy"]["elements"][key] for rank in run["ranks"]]
            if key not in buffers:
                assert sum(shares) == value.numel(), (name, key, shares)
                assert max(shares) < value.numel(), (name, key, shares)


def test_bf16_gathers_parameters_in_bfloat16_and_reduces_gradients_in_float32(tiny_lm, tmp_path):
    """Under trainer.precision bf16 every FSDP2 unit, on every rank, of every module the
    trainer shards (the policy, the KL reference, PPO's value head) has the policy of
    bfloat16 parameters and float32 gradient reduction: every module's forward pass sees its
    parameters in bfloat16, while the shards, the published weights and the optimizer's
    state stay float32. fp32 sets no policy. The bf16 step of two ranks stays close to one
    process's (autocast alone): the same loss and gradient norm to bfloat16's rounding, and
    all but a few weights moved alike."""
    out = tmp_path / "precision.pt"
    torchrun("precision", str(tiny_lm.path), str(out))
    runs = torch.load(out, weights_only=True)
    units = ["policy"] * (tiny_lm.model.config.num_hidden_layers + 1)
    units += ["reference"] * len(units) + ["value_head"]
    for precision, dtypes in {"bf16": (torch.bfloat16, torch.float32),
                              "fp32": (None, None)}.items():
        two = runs[precision]
        for rank in two["units"]:
            assert [name for name, _ in rank] == units, precision
            assert {p for _, p in rank} == {dtypes}, precision
        assert two["params"] == two["optimizer"] == {"torch.float32"}, precision
        assert {v.dtype for v in two["weights"].values()} == {torch.float32}, precision
    assert runs["bf16"]["passes"] == {"torch.bfloat16"}
    assert runs["fp32"]["passes"] == {"torch.float32"}

    one, two = mixed_precision_step(str(tiny_lm.path), World(), "bf16"), runs["bf16"]
    for key in ("loss", "grad_norm"):
        assert two["stats"][key] == pytest.approx(one["stats"][key], rel=5e-3), key
    torch.testing.assert_close(two["old_logprobs"], one["old_logprobs"], atol=2e-2, rtol=0)
    # Adam's first step moves every weight by about lr, its sign the gradient's: where the
    # gradient is near zero, bfloat16's rounding flips it; a wrong gradient flips half
    lr = 1e-2
    moved_otherwise = sum(int(((two["weights"][k] - v).abs() > lr / 2).sum())
                          for k, v in one["weights"].items())
    assert moved_otherwise <= 0.02 * sum(v.numel() for v in one["weights"].values())
