"""The memory a run's services plan to hold, as `relayrl check` prints it: every copy of the
weights each service keeps, named after the setting that keeps it, the KV caches, and the
trainer's largest pass, its activations counted on the meta device (nothing is computed or
allocated); and what each process holds on each of its GPUs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from relayrl.config import ConfigError, RunConfig, TinyModel, VllmEngineConfig

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GIB = 1 << 30


# The model's size ------------------------------------------------------------------------

def meta_model(cfg: RunConfig, model_dir: Path | None) -> Any:
    """The run's model built from its config (the one in `model_dir`, else the tiny model's)
    on the current device, the meta device for counting."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if model_dir is not None:
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    if isinstance(cfg.model, TinyModel):
        from relayrl_torch.models.tiny import build_model

        return build_model(cfg.model, cfg.model.limits().vocab_size, Path("."))
    # a pretrained model not yet converted: its known shape is not at hand
    raise ConfigError("model: not converted yet; run `relayrl prepare` to count it")


def count_parameters(cfg: RunConfig, model_dir: Path | None) -> int:
    """Counted on the meta device: no weights are read or allocated."""
    import torch

    with torch.device("meta"):
        model = meta_model(cfg, model_dir)
    seen: set[int] = set()
    total = 0
    for p in model.parameters():  # a tied tensor once
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def adapter_parameters(cfg: RunConfig, model_dir: Path | None) -> int:
    """The LoRA adapter's parameters, counted on the meta device."""
    import torch

    from relayrl_torch.models.lora import with_lora

    with torch.device("meta"):
        model = meta_model(cfg, model_dir)
        wrapped = with_lora(model, cfg.trainer.lora)
    return sum(p.numel() for p in wrapped.parameters() if p.requires_grad)


# What each service holds -----------------------------------------------------------------

def planned_memory(cfg: RunConfig, model_dir: Path | None, longest_prompt: int | None = None
                   ) -> list[tuple[str, int, list[tuple[str, float]]]] | None:
    """memory_plan for the model in `model_dir`, rows sized by the task's `longest_prompt`
    in tokens when it was measured; None when the model's size cannot be counted."""
    import torch

    try:
        params = count_parameters(cfg, model_dir)
        adapter = adapter_parameters(cfg, model_dir) if cfg.trainer.lora else 0
    except Exception:  # an adapter the model refuses fails its own step of the check
        return None
    activations, kv_per_token = None, 0
    try:  # a family the meta device cannot run: the rest of the plan stands
        with torch.device("meta"):
            model = meta_model(cfg, model_dir)
        kv_per_token = kv_values_per_token(model.config)
        tokens, rows = pass_shape(cfg, longest_prompt)
        activations = (tokens, pass_activations(model, tokens, rows,
                                                cfg.trainer.activation_checkpointing))
    except Exception:
        pass
    return memory_plan(cfg, params, adapter, activations, kv_per_token,
                       row_tokens(cfg, longest_prompt))


def row_tokens(cfg: RunConfig, longest_prompt: int | None = None) -> int:
    """The longest row a batch or an eval can hold: the longest prompt (the task's, when
    measured, else the longest the engine takes) and rollout.max_new_tokens, within the
    engine's window; the whole window for an environment, whose turns add their own tokens."""
    window = cfg.prompt_window()
    if cfg.rollout.environment is not None:
        return window.engine
    return min(window.engine, prompt_tokens(cfg, longest_prompt) + cfg.rollout.max_new_tokens)


def prompt_tokens(cfg: RunConfig, longest_prompt: int | None = None) -> int:
    """The longest prompt a row starts with: the task's, when measured, else the longest the
    engine takes, which is also what an environment's opening (its own system message, its
    tools' declarations) is bounded by."""
    window = cfg.prompt_window()
    if longest_prompt is None or cfg.rollout.environment is not None:
        return window.longest
    return min(longest_prompt, window.longest)


def longest_prompt(cfg: RunConfig, task: Any, sample: int = 256) -> int | None:
    """The longest prompt in tokens, as the run's workers lay it out, over the held-out
    problems and the first `sample` training problems; None for the tiny model."""
    from relayrl_tasks.tasks.run_task import prompt_counter, tokenizer_dir
    from relayrl_torch.models import pretrained_dir

    count = prompt_counter(cfg, tokenizer_dir(cfg, pretrained_dir))
    if count is None:
        return None
    problems = [*task.eval_problems(), *sample_problems(task, sample)]
    return max((count(p.text, p.messages) for p in problems), default=None)


def kv_values_per_token(config: Any) -> int:
    """Keys and values one token holds in a decoder's cache, over all its layers."""
    text = config.get_text_config()
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    return 2 * text.num_hidden_layers * kv_heads * head_dim


def pass_shape(cfg: RunConfig, longest_prompt: int | None = None) -> tuple[int, int]:
    """(tokens, rows) of the trainer's largest forward and backward pass, rows as long as the
    longest a batch holds (row_tokens): as many as trainer.micro_batch_tokens holds (at
    least one), or the whole batch when it is 0. Under trainer.shared_prefix the bound holds
    the responses, and the distinct prompts run besides, at most one a group. Packed rows
    (trainer.packing) are as wide as the longest sequence, as many as the bound holds, or
    one row of at most the bound: no larger."""
    row, groups = row_tokens(cfg, longest_prompt), cfg.buffer.groups_per_batch
    prompt = prompt_tokens(cfg, longest_prompt)
    batch_rows = groups * cfg.buffer.group_size
    mbt, tc = cfg.trainer.micro_batch_tokens, cfg.trainer
    if tc.shared_prefix and not tc.activation_checkpointing:
        response = max(row - prompt, 1)
        responses = batch_rows * response
        tokens = (responses if mbt <= 0 else min(responses, max(mbt, response))) \
            + min(groups, batch_rows) * min(prompt, row)
    else:
        tokens = batch_rows * row if mbt <= 0 else min(batch_rows, max(1, mbt // row)) * row
    return tokens, -(-tokens // row)


def pass_activations(model, tokens: int, rows: int, checkpointing: bool) -> int:
    """Bytes autograd keeps for the backward of one training pass of `rows` rows, `tokens`
    in all, besides the weights, through `model` on the meta device (nothing is computed or
    allocated), plus the backward's largest transient: two [tokens, vocabulary] float32
    gradients of the log-softmax, or where the trainer runs the output layer a chunk of
    positions at a time (trainer_svc.output_layer), three chunks. With `checkpointing` a
    decoder layer keeps only its input, and one layer's activations exist at a time
    (recomputed in the backward).
    Counted in float32, the trainer's precision on the CPU; under bfloat16 autocast most
    of what the layers keep is half as large."""
    import torch
    from torch.autograd.graph import saved_tensors_hooks
    from transformers import AttentionInterface

    from trainer_svc import output_layer

    class FusedAttention(torch.autograd.Function):
        """What a fused attention kernel (SDPA's flash kernels, on CPU and GPU) keeps for
        its backward: inputs, output and a log-sum-exp per query, never the [L, L] weights
        (SDPA on the meta device takes the unfused path, which keeps them)."""

        @staticmethod
        def forward(ctx, q, k, v):
            out = torch.empty_like(q)
            ctx.save_for_backward(q, k, v, out, q.new_empty(q.shape[:-1]))
            return out

        @staticmethod
        def backward(ctx, grad):  # never run: the graph is only counted
            raise NotImplementedError

    AttentionInterface.register(
        "relayrl_fused_count",
        lambda module, q, k, v, mask, **kw: (FusedAttention.apply(q, k, v).transpose(1, 2), None))
    model.config._attn_implementation = "relayrl_fused_count"
    # the repeated blocks a Hugging Face model names in _no_split_modules
    block = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in block]
    inside = {"layer": False}
    kept = {"in_layers": {}, "outside": {}}

    weights = {p.untyped_storage()._cdata for p in model.parameters()}

    def pack(t):
        key = t.untyped_storage()._cdata  # views of one tensor are kept once
        if key not in weights:  # a weight a backward reads is held anyway
            where = kept["in_layers" if inside["layer"] else "outside"]
            where[key] = max(where.get(key, 0), t.numel() * t.element_size())
        return t

    hooks = [h for layer in layers for h in (
        layer.register_forward_pre_hook(lambda *_: inside.update(layer=True)),
        layer.register_forward_hook(lambda *_: inside.update(layer=False)))]
    model.train()
    ids = torch.zeros(rows, max(2, tokens // rows), dtype=torch.long, device="meta")
    vocabulary = model.get_output_embeddings().weight.shape[0]
    chunked = output_layer.chunks(model, ids.numel())
    try:
        with saved_tensors_hooks(pack, lambda t: t):
            if chunked:  # the output layer keeps the hidden states alone
                model.get_decoder()(input_ids=ids)
            else:
                logits = model(input_ids=ids).logits[:, :-1]
                torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, 1:, None])
    finally:
        for h in hooks:
            h.remove()
    in_layers = sum(kept["in_layers"].values())
    outside = sum(kept["outside"].values())
    if checkpointing:
        hidden = model.config.get_text_config().hidden_size
        in_layers = len(layers) * ids.numel() * hidden * 4 + in_layers // max(len(layers), 1)
    transient = (3 * output_layer.CHUNK_ELEMENTS if chunked
                 else 2 * ids.numel() * vocabulary) * 4
    return outside + in_layers + transient


def sample_problems(task: Any, n: int) -> list[Any]:
    """The task's first `n` training problems, else (none to be had) its first held-out ones."""
    out = []
    for i in range(n):
        try:
            out.append(task.problem(i))
        except Exception:
            break
    return out or task.eval_problems()[:n]


HOST_ONLY = ("two publish snapshots", "past versions for the engine check")  # never on a GPU


def gpu_memory(cfg: RunConfig, rows: list[tuple[str, int, list[tuple[str, float]]]],
               processes: list) -> dict[str, float]:
    """Bytes each process with GPUs holds on each of them, from the memory plan's `rows`:
    its service's parts but those kept in host memory, shared among a trainer's ranks
    (FSDP2 shards weights, gradients and optimizer state; each rank passes its share of a
    batch); a vLLM worker's weights over its tensor-parallel GPUs, its KV cache and
    headroom, or its share of the GPU; a relay's kept versions only for the nccl plane."""
    from relay_svc.vllm_planes import PACKED_BUFFER_BYTES, PACKED_BUFFERS
    from rollout_svc.engines.vllm import GPU_HEADROOM

    TRANSFER_BUFFERS = PACKED_BUFFERS * PACKED_BUFFER_BYTES  # a vLLM NCCL transfer's, each side

    parts = {service: dict(p) for service, _, p in rows}

    def device_bytes(service: str) -> float:
        return sum(b for name, b in parts.get(service, {}).items()
                   if not name.startswith(HOST_ONLY))

    e, res = cfg.rollout.engine, cfg.resources
    out: dict[str, float] = {}
    for p in processes:
        if not p.gpus:
            continue
        if p.name == "trainer":
            out[p.name] = device_bytes("trainer") / (len(p.gpus) if cfg.trainer.fsdp else 1)
        elif p.module == "relay_svc":
            planes = set(cfg.relay.data_planes)
            out[p.name] = ((device_bytes("relay") if planes & {"nccl", "vllm"} else 0.0)
                           + (TRANSFER_BUFFERS if "vllm" in planes else 0))
        elif p.module == "rollout_svc" and isinstance(e, VllmEngineConfig):
            share = e.gpu_memory_utilization * res.nodes[p.node].gpu_memory_gib * GIB
            weights, kv = (sum(b for n, b in parts["rollout worker"].items() if n != "KV cache"),
                           parts["rollout worker"]["KV cache"])
            transfer = TRANSFER_BUFFERS if cfg.rollout.weight_plane == "vllm" else 0
            out[p.name] = (share or weights / len(p.gpus) + kv + GPU_HEADROOM) + transfer
        elif p.module == "rollout_svc":
            out[p.name] = device_bytes("rollout worker")
        else:
            out[p.name] = device_bytes("evaluator")
    return out


def gpu_loads(cfg: RunConfig, processes: list, on_gpu: dict[str, float]
              ) -> dict[tuple[int, int], tuple[float, list[str]]]:
    """(node, GPU) -> (bytes planned on it, the processes that hold them)."""
    loads: dict[tuple[int, int], tuple[float, list[str]]] = {}
    for p in processes:
        for g in p.gpus or ():
            used, names = loads.get((p.node, g), (0.0, []))
            loads[(p.node, g)] = (used + on_gpu.get(p.name, 0.0), [*names, p.name])
    return loads


def memory_plan(cfg: RunConfig, params: int, adapter: int = 0,
                activations: tuple[int, int] | None = None, kv_per_token: int = 0,
                row: int | None = None) -> list[tuple[str, int, list[tuple[str, float]]]]:
    """(service, how many run, [(what it holds, bytes)]) for a model of `params` parameters
    (and, with trainer.lora, an adapter of `adapter`): every copy of the weights each
    service keeps, named after the setting that keeps it; with `activations` (tokens,
    bytes) the trainer's largest pass, and with `kv_per_token` (kv_values_per_token) the
    KV cache the evaluation decodes with, for sequences of `row` tokens (row_tokens by
    default)."""
    from relayrl_torch.devices import resolve_device

    tc, shipped = cfg.trainer, DTYPE_BYTES[cfg.model.dtype_name()]
    trained = adapter or params
    version = trained * shipped  # what one version weighs on the wire and in the relay
    # A CPU trainer publishing through shared memory writes each version straight into its
    # file and re-scores under float32 versions read from theirs (trainer_svc.publisher)
    stages = tc.publish_plane == "shm" and resolve_device(tc.device, "trainer.device").type \
        == "cpu"
    past = tc.engine_check_versions if tc.engine_check_seqs else 0
    if stages and shipped == 4 and not tc.lora:  # those the relay lets go, held on here
        past = max(0, past - (cfg.relay.keep_versions - 1))
    trainer = [("float32 weights", params * 4),
               ("gradients", trained * 4),
               # Adafactor's factored moments are a row and a column per matrix: ~0 here
               ("AdamW moments (trainer.optimizer)",
                trained * 8 if tc.optimizer.kind == "adamw" else 0),
               ("KL reference (trainer.loss.kl_coef)",
                params * 4 if tc.loss.kl_coef > 0 and not tc.lora else 0),
               ("past versions for the engine check (trainer.engine_check_versions)",
                trained * 4 * past),
               ("two publish snapshots", 0 if stages else 2 * version)]
    if activations is not None:
        tokens, size = activations
        how = ("trainer.micro_batch_tokens, activation_checkpointing on"
               if tc.activation_checkpointing
               else "trainer.micro_batch_tokens, shared_prefix's prompts besides"
               if tc.shared_prefix else "trainer.micro_batch_tokens")
        trainer.append((f"activations of a {tokens}-token pass ({how})", size))
    relay = [(f"{cfg.relay.keep_versions} versions (relay.keep_versions)",
              cfg.relay.keep_versions * version)]
    e = cfg.rollout.engine
    kv = e.kv_cache_gib * GIB if isinstance(e, VllmEngineConfig) else 0
    worker = [(f"{cfg.model.dtype_name()} weights", params * shipped), ("KV cache", kv)]
    plan = [("trainer", 1, trainer), ("relay", 1 + cfg.relay.children, relay),
            ("rollout worker", cfg.rollout.num_workers, worker)]
    if cfg.eval.every and kv_per_token:
        # eval.batch_size sequences decoded at once, each at most a row
        row = row or row_tokens(cfg)
        eval_kv = (f"KV cache of {cfg.eval.batch_size} sequences of {row} tokens "
                   "(eval.batch_size)", cfg.eval.batch_size * row * kv_per_token * shipped)
        if cfg.eval.mode == "separate":
            plan.append(("evaluator", 1, [(f"{cfg.model.dtype_name()} weights",
                                           params * shipped), eval_kv]))
        else:  # between steps, never beside a pass's activations
            trainer.append((f"{eval_kv[0]}, between steps", eval_kv[1]))
    return plan
