"""Tiny random causal LMs of the families users bring, built locally from their configs with
a real tokenizer and chat template (SmolLM2's), for tests that run every family through the
trainer and both engines.

    path = build_family("gemma2", out_dir, tokenizer_dir)

Each is about 3-6 M parameters (the vocabulary dominates). Head size 32 and two heads: vLLM's
CPU attention takes 32. Tied and untied output layers, sliding-window attention (Gemma 2 and
3) and mixtures of experts (Qwen2-MoE with a shared expert, Qwen3-MoE, Mixtral) are all
among them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

EXPERT_FAMILIES = ("qwen2_moe", "qwen3_moe", "mixtral")  # mixtures of experts
FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3", "phi3", *EXPERT_FAMILIES)


def family_config(name: str, tokenizer: Any) -> Any:
    import transformers

    common = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                  max_position_embeddings=512, bos_token_id=tokenizer.bos_token_id,
                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    configs = {
        "llama": lambda: transformers.LlamaConfig(**common, tie_word_embeddings=True),
        "qwen2": lambda: transformers.Qwen2Config(**common),
        "qwen3": lambda: transformers.Qwen3Config(**common, head_dim=32),
        "mistral": lambda: transformers.MistralConfig(**common, sliding_window=None),
        "gemma2": lambda: transformers.Gemma2Config(**common, head_dim=32, sliding_window=64),
        "gemma3": lambda: transformers.Gemma3TextConfig(**common, head_dim=32,
                                                        sliding_window=64),
        "phi3": lambda: transformers.Phi3Config(**common),
        "qwen2_moe": lambda: transformers.Qwen2MoeConfig(
            **common, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
            shared_expert_intermediate_size=32),
        "qwen3_moe": lambda: transformers.Qwen3MoeConfig(
            **common, head_dim=32, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=32),
        "mixtral": lambda: transformers.MixtralConfig(
            **common, num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
    }
    if name not in configs:
        raise ValueError(f"family: {name!r} is not one of {', '.join(FAMILIES)}")
    return configs[name]()


def build_family(name: str, out: Path, tokenizer_dir: Path, seed: int = 0,
                 brief: bool = False) -> Path:
    """A randomly initialised model of the family, with the tokenizer, saved under `out`.

    `brief`: its replies end after a few tokens, so a multi-turn episode sees its environment
    answer (a random model over a large vocabulary would run every reply to its token
    budget). Its last norm reads one dimension of the hidden state, which half the tokens
    push positive, and the output layer turns that dimension into a large end-of-turn
    logit when it is."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if (out / "config.json").is_file():
        return out
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(family_config(name, tokenizer))
    if brief:
        with torch.no_grad():
            norm = model.get_decoder().norm.weight
            norm.zero_()
            norm[0] = 1.0
            head = model.get_output_embeddings().weight
            # (tied layers: also the inputs) half the tokens lead to the end of the turn
            head[:, 0] = 0.05 * (torch.randint(0, 2, head[:, 0].shape) * 2 - 1)
            head[_opening_tokens(tokenizer), 0] = -0.05  # a reply has a first token

            head[tokenizer.eos_token_id, 0] = 200.0  # past log(vocabulary) at small values
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _opening_tokens(tokenizer: Any) -> list[int]:
    """The tokens the chat template opens an assistant turn with."""
    turn = [{"role": "user", "content": "x"}]
    bare = tokenizer.apply_chat_template(turn, tokenize=False)
    opened = tokenizer.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(opened[len(bare):], add_special_tokens=False)
