"""Which tokenizer counts the run's prompts: none for the tiny model, the configured model's
directory, and a pretrained model's as the caller's converter gives it (the model side
converts; the tasks package never imports it)."""

from pathlib import Path

import pytest

from relayrl.config import RunConfig
from relayrl_tasks.tasks import load_run_task
from relayrl_tasks.tasks.run_task import tokenizer_dir

pytestmark = pytest.mark.unit


def refuse(model):
    raise AssertionError(f"{model.kind} converted")


def test_the_tiny_model_counts_with_no_tokenizer_and_converts_nothing():
    cfg = RunConfig.model_validate({})
    assert tokenizer_dir(cfg, refuse) is None
    assert load_run_task(cfg, refuse).eval_problems()


def test_a_configured_model_is_its_own_directory(tmp_path):
    cfg = RunConfig.model_validate({"model": {"kind": "hf", "path": str(tmp_path)}})
    assert tokenizer_dir(cfg, refuse) == tmp_path


def test_a_pretrained_model_is_where_the_converter_puts_it(tmp_path):
    cfg = RunConfig.model_validate({"model": {"kind": "pretrained",
                                              "cache_dir": str(tmp_path)}})
    asked = []

    def convert(model) -> Path:
        asked.append(model)
        return model.converted_dir

    assert tokenizer_dir(cfg, convert) == tmp_path / "smollm2-135m-instruct"
    assert asked == [cfg.model]
