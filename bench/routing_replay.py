"""The engine/trainer log-probability gap of a mixture of experts, with and without routing
replay, against its dense counterpart's.

    python bench/routing_replay.py [--prompts 8] [--samples 4] [--tokens 48]

For each tiny random mixture of experts of relayrl_testkit.families (Qwen2-MoE, Qwen3-MoE,
Mixtral) and the dense model of its family (Qwen2, Qwen3, Mistral), the torch engine samples
sequences from random prompts of several lengths, in batches with a KV cache, recording each
position's experts (rollout_svc.engines.torch, record_routes); the trainer's forward
(trainer_svc.batching.policy_outputs, float32, whole padded rows) then scores the same tokens,
without replay (its routers choose) and with it (trainer.routing_replay: the recorded
experts, weighted by its routers' softmax). The engine computes in bfloat16, as a GPU engine
serves, and in float32, the trainer's own dtype. For each model and engine dtype the bench
reports the mean and the largest |logp_engine - logp_trainer| over the response tokens, and
`flipped`, the share of (position, layer) routes where the trainer's own top-k differs from
the engine's. A dense model's gap is the floor rounding alone gives at that precision; a
flipped route sends a token through another expert and moves its log-probability far past
that floor; replayed, the mixture of experts sits at the floor again.

Ends with one JSON line (bench/results/routing_replay.jsonl) and draws
docs/results/routing_replay.png.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402

PAIRS = {"qwen2_moe": "qwen2", "qwen3_moe": "qwen3", "mixtral": "mistral"}
DTYPES = ("bfloat16", "float32")
PICTURE = ROOT / "docs" / "results" / "routing_replay.png"


def sampled(model_dir: Path, dtype: str, prompts: int, samples: int, tokens: int, seed: int):
    """Groups of samples the torch engine drew in `dtype`, carrying their routes."""
    import torch

    from relayrl.contracts.messages import Group, Sample
    from relayrl_torch.models.loading import load_model
    from rollout_svc.engines.api import SamplingSpec
    from rollout_svc.engines.torch import TorchEngine

    lm = load_model(model_dir, dtype=dtype)
    engine = TorchEngine(lm, seed=seed, record_routes=True)
    g = torch.Generator().manual_seed(seed)
    contexts = [torch.randint(0, len(lm.tokenizer), (int(n),), generator=g).tolist()
                for n in torch.randint(4, 24, (prompts,), generator=g)]
    outs = engine.generate([c for c in contexts for _ in range(samples)],
                           SamplingSpec(max_new_tokens=tokens, ignore_eos=True))
    groups = []
    for i, context in enumerate(contexts):
        group = outs[i * samples:(i + 1) * samples]
        groups.append(Group(i, [Sample(
            prompt_id=i, lease_id="bench", worker_id="bench", prompt_tokens=context,
            response_tokens=o.tokens, logprobs=o.logprobs, versions=[0] * len(o.tokens),
            reward=0.0, routes=o.routes) for o in group]))
    return groups


def gaps(model, groups, replay: bool) -> dict:
    """|engine - trainer| log-probabilities over the response tokens, and the share of routes
    the trainer's routers would choose otherwise."""
    import torch

    from relayrl_torch.models.routing import routers
    from trainer_svc.batching import collate, policy_outputs

    tb = collate(groups, 0, 0, scale_rewards=False, replay=True)
    own: list[torch.Tensor] = []
    hooks = [r.register_forward_hook(lambda m, a, out: own.append(out[2]))
             for r in routers(model)]
    try:
        with torch.no_grad():
            logp = policy_outputs(model, tb if replay else _without_routes(tb), 1.0).logprobs
    finally:
        for h in hooks:
            h.remove()
    mask = tb.response_mask > 0
    diff = (logp - tb.behaviour_logprobs).abs()[mask]
    out = {"mean": float(f"{diff.mean().item():.3g}"), "max": float(f"{diff.max().item():.3g}")}
    if own and not replay:
        layers = tb.routes.shape[2]  # the pass's own calls: the last (a probe may precede)
        chosen = torch.stack(own[-layers:], dim=1).view(*tb.routes.shape)
        recorded = tb.routes >= 0
        same = (chosen.sort(-1).values == tb.routes.long().sort(-1).values).all(-1)
        out["flipped"] = float(f"{(~same & recorded.all(-1)).sum() / recorded.all(-1).sum():.3g}")
    return out


def _without_routes(tb):
    import dataclasses

    return dataclasses.replace(tb, routes=tb.routes[:, :, :0, :0])


def measure(model_dir: Path, dtype: str, args) -> dict:
    from relayrl_torch.models.loading import load_model
    from relayrl_torch.models.routing import routers

    groups = sampled(model_dir, dtype, args.prompts, args.samples, args.tokens, args.seed)
    trainer = load_model(model_dir).model  # float32, as the trainer holds it
    if not routers(trainer):
        return {"dense": gaps(trainer, groups, replay=False)}
    return {"no_replay": gaps(trainer, groups, replay=False),
            "replay": gaps(trainer, groups, replay=True)}


def draw(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(DTYPES), figsize=(10, 3.6), sharey=False)
    kinds = (("dense", "dense model", "#888888"), ("no_replay", "MoE, no replay", "#d62728"),
             ("replay", "MoE, routing replay", "#2ca02c"))
    for ax, dtype in zip(axes, DTYPES, strict=True):
        families = list(results[dtype])
        for k, (key, label, color) in enumerate(kinds):
            values = [results[dtype][f].get(key, {}).get("mean", 0.0) for f in families]
            ax.bar([i + (k - 1) * 0.27 for i in range(len(families))], values, 0.27,
                   label=label, color=color)
        ax.set_xticks(range(len(families)), families)
        ax.set_yscale("log")
        ax.set_title(f"engine {dtype}, trainer float32")
        ax.set_ylabel("mean |logp engine - trainer|")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = harness.parser("routing_replay", __doc__.splitlines()[0],
                       smoke_help="Qwen2-MoE and Qwen2, 2 prompts of 2 samples, 6 tokens")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    pairs = dict(PAIRS)
    if args.smoke:
        args.prompts, args.samples, args.tokens = 2, 2, 6
        pairs = {"qwen2_moe": "qwen2"}
    import torch

    from relayrl_testkit.families import build_family
    from relayrl_torch.models.smollm2 import ensure_smollm2

    torch.set_num_threads(1)
    tokenizer = ensure_smollm2(ROOT / ".cache/relayrl/models")
    results: dict[str, dict[str, dict]] = {d: {} for d in DTYPES}
    with tempfile.TemporaryDirectory(prefix="relayrl-routing-") as tmp:
        for moe, dense in pairs.items():
            for dtype in DTYPES:
                row = {**measure(build_family(moe, Path(tmp) / moe, tokenizer), dtype, args),
                       **measure(build_family(dense, Path(tmp) / dense, tokenizer), dtype,
                                 args)}
                results[dtype][moe] = row
                print(f"{moe:10s} {dtype:9s} {row}", file=sys.stderr, flush=True)
    picture = None
    if not args.smoke:
        draw(results, PICTURE)
        picture = PICTURE
    harness.report(args, {"prompts": args.prompts, "samples": args.samples,
                          "tokens": args.tokens, "results": results}, picture)


if __name__ == "__main__":
    main()
