"""Tier markers follow the directory: tests/unit -> unit, tests/integration -> integration."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

TIERS = ("unit", "integration", "chaos")


def pytest_collection_modifyitems(config, items):
    for item in items:
        parts = Path(str(item.fspath)).parts
        for tier in TIERS:
            if tier in parts:
                item.add_marker(getattr(pytest.mark, tier))


def free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory):
    """A small randomly initialised Llama model with the addition tokenizer."""
    import torch

    from relayrl.config import ModelConfig
    from relayrl.models import load_model
    from relayrl.models.tiny import SPECIALS, build_model, build_tokenizer
    from relayrl.tasks import AdditionTask

    out = tmp_path_factory.mktemp("tiny_lm")
    build_tokenizer(AdditionTask.alphabet, out)
    cfg = ModelConfig(hidden_size=32, num_layers=2, num_heads=2)
    build_model(cfg, len(SPECIALS) + len(set(AdditionTask.alphabet)), out).save_pretrained(out)
    torch.manual_seed(0)
    return load_model(out)
