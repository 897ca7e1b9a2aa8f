"""Three optimizer steps on a fixed batch, run by test_distributed_trainer.py in one process
and, as this module's main, on every rank of
`torchrun -m tests.integration.distributed_worker scenarios MODEL_DIR OUT REDIS_URL RUN_DIR`.
Rank 0 leads and the others follow, as in the service.

Each scenario steps a Learner twice, gathers the whole training state, takes a step that a
restore of that state then takes back, and takes the third step. The service scenario runs
the Trainer on batches from Redis, checkpoints after two steps, and a new Trainer resumes
from the checkpoint for the third.

`torchrun -m tests.integration.distributed_worker idle MODEL_DIR OUT` starts the process
group with a timeout of IDLE_TIMEOUT_S, and rank 0 waits several times as long before each
of two steps, as a trainer waiting for batches does.

`torchrun -m tests.integration.distributed_worker load MODEL_DIR OUT BASE_DIR` loads the
model as the service's ranks do, sharded and replicated, from MODEL_DIR and from BASE_DIR
(the same weights under the names of the base model, without its `model.` prefix), and
keeps what each rank holds.

`torchrun -m tests.integration.distributed_worker precision MODEL_DIR OUT` takes one PPO step
with a KL reference under trainer.precision bf16 and under fp32, and keeps the dtypes the
passes saw and the mixed-precision policy of every FSDP2 unit."""

from __future__ import annotations

import copy
import os
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from relay_svc.version_store import VersionStore
from relayrl.config import RunConfig
from relayrl.contracts.keys import RunKeys
from relayrl.contracts.messages import Batch, Group, Sample, encode_batch
from relayrl.contracts.streams import FIELD
from relayrl.runtime.redis_conn import connect
from relayrl_torch.models.loading import load_model
from trainer_svc.batching import collate
from trainer_svc.distributed import Parallel, World, init_world, leave_world, stored_state
from trainer_svc.learner import Learner
from trainer_svc.loop import Trainer
from trainer_svc.publisher import AsyncPublisher

MAX_NEW_TOKENS = 4
IDLE_TIMEOUT_S = 3.0  # trainer.dist_timeout_s of the idle run
IDLE_S = 3 * IDLE_TIMEOUT_S  # how long its rank 0 waits before each step

SCENARIOS: dict[str, dict] = {
    # a sequence-mean loss, three uneven groups over two ranks
    "grpo": {"trainer": {"loss": "grpo"}, "groups": 3},
    # a token-mean loss with a value head, batch-wide whitening and a frozen reference
    "ppo_kl": {"trainer": {"loss": {"name": "ppo", "kl_coef": 0.05, "entropy_coef": 0.01}},
               "groups": 3},
    # batch-wide advantage normalisation, two updates per batch, weights replicated
    "reinforce_pp_replicated": {"trainer": {"loss": "reinforce_pp", "fsdp": False,
                                            "updates_per_batch": 2}, "groups": 3},
    # each rank passes its rows one at a time (micro-batches within a rank's share)
    "ppo_micro_batches": {"trainer": {"loss": "ppo", "micro_batch_tokens": 1}, "groups": 3},
    "grpo_micro_batches": {"trainer": {"loss": "grpo", "micro_batch_tokens": 1,
                                       "updates_per_batch": 2}, "groups": 3},
    # fewer groups than ranks: rank 1 has no rows of its own
    "dapo_one_group": {"trainer": {"loss": "dapo"}, "groups": 1},
    # the first update's loss is NaN on rank 1 alone (its group's rewards): every rank
    # skips that step, and the next two go on in step
    "grpo_nonfinite_on_one_rank": {"trainer": {"loss": "grpo"}, "groups": 3, "nan_group": 2},
}


def scenario_config(name: str) -> RunConfig:
    return RunConfig.model_validate({
        "run_id": name, "rollout": {"max_new_tokens": MAX_NEW_TOKENS},
        "trainer": {"optimizer": {"lr": 1e-2}, "max_staleness": 100, "engine_check_seqs": 0,
                    **SCENARIOS[name]["trainer"]},
    })


def load(model_dir: str, world: World):
    """The model as the service's trainer loads it: on the meta device under torchrun (each
    rank reads its shard once it is sharded), whole in one process."""
    return load_model(model_dir, meta=world.size > 1)


def fixed_groups(lm, n_groups: int) -> list[Group]:
    """Groups of 3, 2 and 4 samples with varied rewards, lengths and one tool token."""
    groups = []
    for pid, size in enumerate((3, 2, 4)[:n_groups]):
        prompt = lm.encode_prompt(f"{pid + 1}+{pid + 2}=")
        samples = []
        for k in range(size):
            response = lm.tokenizer.encode(f"{k}{pid}{k + 1}", add_special_tokens=False)
            response = [*response[:1 + (k + pid) % 3], lm.eos_id]
            mask = [1] * len(response)
            if k == 1 and len(response) > 2:
                mask[1] = 0  # a token the model did not produce
            samples.append(Sample(
                prompt_id=pid, lease_id="l", worker_id="w", prompt_tokens=prompt,
                response_tokens=response,
                logprobs=[-0.8 - 0.3 * j - 0.1 * k for j in range(len(response))],
                versions=[0] * len(response), reward=float((k + pid) % 2), loss_mask=mask))
        groups.append(Group(pid, samples))
    return groups


def run_scenario(name: str, model_dir: str, world: World) -> dict | None:
    """On rank 0 (or in one process): weights after the three steps, each step's stats and
    the first step's old log-probabilities. The other ranks follow rank 0 and return None."""
    cfg = scenario_config(name)
    torch.manual_seed(0)
    learner = Learner(cfg.trainer_part(), load(model_dir, world), Parallel(world, cfg.trainer.fsdp))
    if not world.is_main:
        learner.follow()
        return None
    batch = collate(fixed_groups(learner.lm, SCENARIOS[name]["groups"]), version=0,
                    pad_id=learner.lm.pad_id, scale_rewards=True)
    first = batch
    if "nan_group" in SCENARIOS[name]:
        first = copy.deepcopy(batch)
        first.rewards[first.group_ids == SCENARIOS[name]["nan_group"]] = float("nan")
    results = [learner.update(first), learner.update(batch)]
    state = copy.deepcopy(learner.training_state())  # in one process it holds live tensors
    learner.update(batch)  # a step the restore takes back
    learner.restore(state.objective, state.model, state.optimizer, state.optimizer_by_name)
    results.append(learner.update(batch))
    out = {"weights": learner.weights(), "stats": [r.stats for r in results],
           "old_logprobs": results[0].old_logprobs,
           "nonfinite": [r.nonfinite for r in results],
           "objective": copy.deepcopy(learner.training_state().objective)}
    learner.stop_followers()
    return out


def run_after_idling(model_dir: str, world: World, idle_s: float) -> dict | None:
    """On rank 0 (or in one process): two GRPO steps, rank 0 waiting `idle_s` before each,
    and the weights after them. The other ranks follow and return None."""
    cfg = scenario_config("grpo")
    torch.manual_seed(0)
    learner = Learner(cfg.trainer_part(), load(model_dir, world), Parallel(world, cfg.trainer.fsdp))
    if not world.is_main:
        learner.follow()
        return None
    batch = collate(fixed_groups(learner.lm, 3), version=0, pad_id=learner.lm.pad_id,
                    scale_rewards=True)
    stats = []
    for _ in range(2):
        time.sleep(idle_s)
        stats.append(learner.update(batch).stats)
    out = {"weights": learner.weights(), "stats": stats}
    learner.stop_followers()
    return out


def loaded_on_ranks(model_dir: str, world: World, fsdp: bool) -> dict:
    """The policy, its KL reference and value head built as the service's trainer builds them
    (trainer.loss ppo with kl_coef): rank 0's whole weights of the policy and the reference;
    every rank's buffers, whether its parameters are sharded, and how many of each tensor's
    elements it holds. Every rank returns it."""
    cfg = RunConfig.model_validate({"trainer": {"loss": {"name": "ppo", "kl_coef": 0.05},
                                                "fsdp": fsdp}})
    learner = Learner(cfg.trainer_part(), load(model_dir, world), Parallel(world, fsdp))
    if world.is_main:  # the rest is not led: every rank runs it
        learner.stop_followers()
    else:
        learner.follow()
    policy, reference = learner.lm.model, learner.objective.reference
    parallel = learner.parallel

    def held(module) -> dict:
        return {"buffers": {k: v.cpu() for k, v in module.named_buffers()},
                "sharded": [isinstance(p, DTensor) for p in module.parameters()],
                "devices": {str(p.device) for p in module.parameters()},
                "elements": {k: (v.to_local() if isinstance(v, DTensor) else v).numel()
                             for k, v in module.state_dict().items()}}

    ranks: list = [None] * world.size
    dist.all_gather_object(ranks, {"policy": held(policy), "reference": held(reference)})
    return {"policy": parallel.full_state_dict(policy),
            "reference": parallel.full_state_dict(reference),
            "stored": stored_state(policy, Path(model_dir)) is not None, "ranks": ranks}


def mixed_precision_step(model_dir: str, world: World, precision: str) -> dict | None:
    """On rank 0 (or in one process): one update of PPO with a KL reference (the policy, the
    reference and the value head: every module the trainer shards) under trainer.precision
    `precision`; its stats, old log-probabilities and weights, the dtypes of the parameters
    every module with parameters of its own held during its forward passes, and after the
    step the dtypes of the policy's parameters and of the optimizer's state; under torchrun,
    the mixed-precision policy of every FSDP2 unit on every rank (gathered onto rank 0). The
    other ranks follow and return None."""
    cfg = RunConfig.model_validate({
        "rollout": {"max_new_tokens": MAX_NEW_TOKENS},
        "trainer": {"optimizer": {"lr": 1e-2}, "max_staleness": 100, "engine_check_seqs": 0,
                    "precision": precision, "loss": {"name": "ppo", "kl_coef": 0.05}}})
    torch.manual_seed(0)
    learner = Learner(cfg.trainer_part(), load(model_dir, world), Parallel(world, cfg.trainer.fsdp))
    modules = {"policy": learner.lm.model, "reference": learner.objective.reference,
               "value_head": learner.objective.value_head}
    passes: set = set()
    for module in modules.values():
        for m in module.modules():
            if next(m.parameters(recurse=False), None) is not None:
                m.register_forward_pre_hook(lambda m, _: passes.update(
                    p.dtype for p in m.parameters(recurse=False)))
    if world.is_main:
        batch = collate(fixed_groups(learner.lm, 3), version=0, pad_id=learner.lm.pad_id,
                        scale_rewards=True)
        result = learner.update(batch)
        out = {"stats": result.stats, "old_logprobs": result.old_logprobs,
               "weights": learner.weights(), "passes": {str(d) for d in passes},
               "params": {str(p.dtype) for p in learner.lm.model.parameters()},
               "optimizer": {str(v.dtype) for state in learner.optimizer.state.values()
                             for v in state.values() if torch.is_tensor(v) and v.numel() > 1}}
        learner.stop_followers()
    else:
        learner.follow()
    # the policy each unit was sharded with, as FSDP2 keeps it in the unit's state: its
    # dtypes, which torch.load reads back without unpickling objects
    units = [(name, (policy.param_dtype, policy.reduce_dtype))
             for name, module in modules.items() for m in module.modules()
             if isinstance(m, FSDPModule) for policy in [fully_shard.state(m)._mp_policy]]
    ranks = [units]
    if world.size > 1:  # the followers have stopped: nothing else is in flight
        ranks = [None] * world.size
        dist.all_gather_object(ranks, units)
    return {**out, "units": ranks} if world.is_main else None


def service_config(redis_url: str, run_dir: str, world: World) -> RunConfig:
    return RunConfig.model_validate({
        "run_id": f"ranks-{world.size}", "run_dir": run_dir, "redis": {"url": redis_url},
        "task": {"digits": 1, "eval_size": 4}, "rollout": {"max_new_tokens": MAX_NEW_TOKENS},
        "trainer": {"loss": "ppo", "optimizer": {"lr": 1e-2}, "max_staleness": 100,
                    "engine_check_seqs": 0,
                    "progress": False},
    })


def run_service_trainer(model_dir: str, redis_url: str, run_dir: str, world: World):
    """The service's own path: two steps on batches from Redis and a checkpoint; then a new
    trainer resumes from it and takes a third. Rank 0's final weights; None elsewhere."""
    cfg = service_config(redis_url, run_dir, world)
    weights = None
    for life in range(2):
        torch.manual_seed(0)
        lm = load(model_dir, world)
        parallel = Parallel(world, cfg.trainer.fsdp)
        if not world.is_main:
            Learner(cfg.trainer_part(), lm, parallel).follow()
            continue
        r = connect(redis_url)
        trainer = Trainer(cfg.trainer_part(), lm, r, AsyncPublisher(VersionStore(4)), parallel)
        trainer.resume()
        if life == 0:
            for i in range(3):
                batch = Batch(f"b{i}", fixed_groups(lm, 3))
                r.xadd(RunKeys(cfg.run_id).batches, {FIELD: encode_batch(batch)})
        for _ in range(2 - life):
            trainer.train_step(*trainer.next_batch(threading.Event()))
        if life == 0:
            trainer.save_checkpoint()
        else:
            weights = trainer.learner.weights()
        trainer.publisher.close()
        trainer.learner.stop_followers()
    return weights


def meet() -> None:
    """Every rank reaches this point before any goes on, through torchrun's own store: a
    rank slow to start would otherwise count against the idle run's short timeout, which
    bounds the process group's rendezvous and every collective's wait for the slower rank."""
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), size,
                          is_master=False, timeout=timedelta(seconds=120))
    store.set(f"relayrl-test/ready/{rank}", "1")
    store.wait([f"relayrl-test/ready/{r}" for r in range(size)])


def main(mode: str, model_dir: str, out: str, *rest: str) -> None:
    if mode == "idle":
        # what building the model imports and reads, done before the ranks meet: between
        # the meeting and the first collective each rank then has little left to do
        load_model(model_dir, meta=True)
        meet()
        world = init_world(timeout_s=IDLE_TIMEOUT_S)
        runs = run_after_idling(model_dir, world, IDLE_S)
    elif mode == "precision":
        world = init_world()
        runs = {p: mixed_precision_step(model_dir, world, p) for p in ("bf16", "fp32")}
    elif mode == "load":
        (base_dir,) = rest
        world = init_world()
        runs = {"sharded": loaded_on_ranks(model_dir, world, fsdp=True),
                "replicated": loaded_on_ranks(model_dir, world, fsdp=False),
                "base_names": loaded_on_ranks(base_dir, world, fsdp=True)}
    else:
        redis_url, run_dir = rest
        world = init_world()
        runs = {name: run_scenario(name, model_dir, world) for name in SCENARIOS}
        runs["service"] = run_service_trainer(model_dir, redis_url, run_dir, world)
    if world.is_main:
        torch.save(runs, out)
    leave_world(world)


if __name__ == "__main__":
    main(*sys.argv[1:])
