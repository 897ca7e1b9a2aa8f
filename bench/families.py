"""Every model family through the whole stack with default settings: `relayrl up` on a tiny
random model of each family, on each engine, for a few trainer steps.

    python bench/families.py [--steps 3] [--families llama,gemma2] [--engines torch,vllm]

The models are relayrl_testkit.families' (Llama, Qwen2, Qwen3, Mistral, Gemma 2 and 3,
Phi-3, Qwen2-MoE, Qwen3-MoE and Mixtral: random weights, SmolLM2's tokenizer and chat
template), built for the run. Each run's config names the model, the engine and the run's
length, and nothing else: every other setting is the default a user gets. The run goes
through relayrl up's launcher (every service its own process, Redis embedded). For each
family and engine the bench reports how the run ended (`trained`: the trainer reached its
last step; `refused`: a service would not start, with the reason it gave; `failed`), its
seconds and the engine/trainer log-probability gap of the trainer's engine check
(`engine_logp_absdiff` in the metrics, the mean over its steps: 0 up to float32 rounding
when the engine applies every version exactly). vLLM's CPU build cannot swap a mixture of
experts' weights, so its worker refuses those families by name.
tests/integration/test_model_families.py checks the same families one trainer step at a
time, in one process. Ends with one JSON line (bench/results/families.jsonl).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from bench.common import assign_free_ports  # noqa: E402
from relayrl.config import RunConfig  # noqa: E402
from relayrl.runtime.metrics import read_records  # noqa: E402
from relayrl_ops.launcher import Launcher, StartFailed  # noqa: E402
from relayrl_testkit.families import FAMILIES, build_family  # noqa: E402

ENGINES = ("torch", "vllm")
RUN_TIMEOUT_S = 900  # a run that neither finishes nor fails by then is reported as failed


def config(family: str, model: Path, engine: str, steps: int, run_dir: Path,
           smallest: bool = False) -> RunConfig:
    """The run's config; `smallest` (the smoke run) with one worker and no evaluator."""
    data = RunConfig.model_validate({
        "run_id": f"family-{family}-{engine}", "run_dir": str(run_dir),
        "model": {"kind": "hf", "path": str(model)},
        "rollout": {"engine": {"kind": engine}, **({"num_workers": 1} if smallest else {})},
        "scheduler": {"start_after_workers": 1} if smallest else {},
        "eval": {"every": 0} if smallest else {},
        "trainer": {"max_steps": steps, "progress": False}}).model_dump(mode="json")
    assign_free_ports(data)
    return RunConfig.model_validate(data)


def run(cfg: RunConfig) -> dict:
    """The run to its end: how it ended, its seconds, and its figures."""
    launcher = Launcher(cfg, show_trainer_output=False)
    started = time.monotonic()
    try:
        launcher.start()
        code = launcher.wait(RUN_TIMEOUT_S)
    except StartFailed as err:  # its message ends with the end of the service's log
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        return {"ended": "refused", "reason": lines[-1][-400:]}
    except TimeoutError as err:
        return {"ended": "failed", "reason": f"{err}: {last_error(Path(cfg.run_dir) / 'logs')}"}
    finally:
        launcher.shutdown()
    seconds = round(time.monotonic() - started, 1)
    if code != 0:
        return {"ended": "failed", "seconds": seconds,
                "reason": f"exit {code}: {last_error(Path(cfg.run_dir) / 'logs')}"}
    figures = [r.figures for r in read_records(Path(cfg.run_dir) / "metrics.jsonl")
               if r.figures.samples]
    gaps = [f.engine_logp_absdiff for f in figures if f.engine_logp_absdiff is not None]
    return {"ended": "trained", "seconds": seconds, "steps": len(figures),
            "engine_logp_absdiff": float(f"{statistics.fmean(gaps):.3g}") if gaps else None}


def last_error(logs: Path) -> str:
    """What a run that did not finish said last of why: the last line naming an error in
    its services' logs (the run's directory is deleted with the bench's)."""
    found = []
    for path in logs.glob("*.log"):
        errors = [ln.strip() for ln in path.read_text(errors="replace").splitlines()
                  if "Error" in ln]
        if errors:
            found.append((path.stat().st_mtime, f"{path.stem}: {errors[-1][-400:]}"))
    return max(found)[1] if found else f"no error in {logs}"


def main(argv: list[str] | None = None) -> None:
    p = harness.parser("families", __doc__.splitlines()[0],
                       smoke_help="Llama on the torch engine: one worker, no evaluator, 1 step")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--families", default=",".join(FAMILIES))
    p.add_argument("--engines", default=",".join(ENGINES))
    args = p.parse_args(argv)
    families, engines = args.families.split(","), args.engines.split(",")
    if args.smoke:
        args.steps, families, engines = 1, ["llama"], ["torch"]
    for name in (*families, *engines):
        if name not in (*FAMILIES, *ENGINES):
            p.error(f"{name!r} is neither a family ({', '.join(FAMILIES)}) nor an engine "
                    f"({', '.join(ENGINES)})")
    from relayrl_torch.models.smollm2 import ensure_smollm2

    tokenizer = ensure_smollm2(ROOT / ".cache/relayrl/models")
    runs: dict[str, dict[str, dict]] = {}
    with tempfile.TemporaryDirectory(prefix="relayrl-families-") as tmp:
        for family in families:
            model = build_family(family, Path(tmp) / family / "model", tokenizer)
            for engine in engines:
                cfg = config(family, model, engine, args.steps, Path(tmp) / family / engine,
                             smallest=args.smoke)
                outcome = run(cfg)
                runs.setdefault(family, {})[engine] = outcome
                print(f"{family:10s} {engine:6s} {outcome}", file=sys.stderr, flush=True)
    ended = [o["ended"] for by_engine in runs.values() for o in by_engine.values()]
    harness.report(args, {"bench": "families", "steps": args.steps,
                          "trained": ended.count("trained"), "refused": ended.count("refused"),
                          "failed": ended.count("failed"), "runs": runs})


if __name__ == "__main__":
    main()
