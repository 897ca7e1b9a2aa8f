"""Dataset tasks: every file format, field mapping, bad rows, held-out splits and the
prompt-id -> record mapping (relayrl_tasks/tasks/dataset.py)."""

import json

import pytest

from relayrl.config import DatasetTaskConfig, RunConfig
from relayrl_tasks.tasks import DatasetTask, PromptLimit, make_task

pytestmark = pytest.mark.unit

ROWS = [{"question": f"What is {i}+{i}?", "answer": str(2 * i), "level": i % 3}
        for i in range(40)]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def task(path, **fields):
    fields.setdefault("prompt", {"field": "question"})
    return DatasetTask(DatasetTaskConfig(path=str(path), **fields))


def every_prompt(t, n):
    return [t.problem(i).messages[-1]["content"] for i in range(n)]


@pytest.mark.parametrize("fmt", ["jsonl", "json", "parquet", "csv", "arrow"])
def test_every_format_gives_the_same_problems(tmp_path, fmt):
    import datasets

    rows = datasets.Dataset.from_list(ROWS)
    path = tmp_path / (f"d.{fmt}" if fmt != "arrow" else "d")
    {"jsonl": lambda: write_jsonl(path, ROWS),
     "json": lambda: rows.to_json(str(path), lines=False),
     "parquet": lambda: rows.to_parquet(str(path)),
     "csv": lambda: rows.to_csv(str(path), index=False),
     "arrow": lambda: rows.save_to_disk(str(path))}[fmt]()
    t = task(path)
    first = t.problem(0)
    assert first.messages == ({"role": "user", "content": first.messages[0]["content"]},)
    want = {r["question"]: r for r in ROWS}[first.messages[0]["content"]]
    assert first.reference == want["answer"]
    # every column, for the reward, as the file holds it (a CSV reads "24" as a number)
    assert {**first.metadata, "answer": str(first.metadata["answer"])} == want
    assert sorted(every_prompt(t, 40)) == sorted(r["question"] for r in ROWS)


def test_prompt_ids_are_a_pure_function_and_epochs_reshuffle(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    a, b = task(path, seed=7), task(path, seed=7)
    assert every_prompt(a, 80) == every_prompt(b, 80)  # another process, or a restart
    assert [a.problem(i).reference for i in (63, 5, 63)] == [b.problem(i).reference
                                                              for i in (63, 5, 63)]
    first, second = every_prompt(a, 40), every_prompt(a, 80)[40:]
    assert sorted(first) == sorted(second) and first != second
    assert every_prompt(task(path, seed=8), 40) != first


def test_templates_system_prompts_and_few_shot(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS[:3])
    t = task(path, prompt={"template": "Q{level}: {question}", "system": "Be brief.",
                           "few_shot": [{"prompt": "What is 1+1?", "answer": "2"}]})
    roles = [m["role"] for m in t.problem(0).messages]
    assert roles == ["system", "user", "assistant", "user"]
    assert t.problem(0).messages[-1]["content"].startswith("Q")
    raw = task(path, prompt={"field": "question", "format": "raw", "system": "Add.",
                             "few_shot": [{"prompt": "1+1=", "answer": "2"}]})
    assert raw.problem(0).text.startswith("Add.\n\n1+1=2\n\nWhat is ")
    assert raw.problem(0).messages == ()


def test_chat_messages_column(tmp_path):
    rows = [{"messages": [{"role": "user", "content": f"hi {i}"}], "answer": "x"}
            for i in range(4)]
    t = task(write_jsonl(tmp_path / "d.jsonl", rows),
             prompt={"messages_field": "messages", "field": None, "system": "S"})
    assert t.problem(0).messages[0] == {"role": "system", "content": "S"}
    assert t.problem(0).messages[1]["content"].startswith("hi ")


def test_bad_rows_mid_dataset_are_skipped_and_counted(tmp_path, caplog):
    rows = list(ROWS[:10])
    rows[3] = {"question": None, "answer": "1", "level": 0}
    rows[6] = {"question": "fine", "answer": None, "level": 0}
    rows[8] = {"question": "   ", "answer": "1", "level": 0}
    t = task(write_jsonl(tmp_path / "d.jsonl", rows))
    assert sum(t.skipped.values()) == 3
    assert len({t.problem(i).reference for i in range(7)} - {r["answer"] for r in ROWS}) == 0
    assert "row 3" in caplog.text and "'question'" in caplog.text
    assert "row 6" in caplog.text and "'answer'" in caplog.text


def test_errors_name_the_file_and_the_field(tmp_path):
    with pytest.raises(ValueError, match="missing.jsonl does not exist"):
        task(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="cannot tell the format of .*d.txt"):
        (tmp_path / "d.txt").write_text("x")
        task(tmp_path / "d.txt")
    with pytest.raises(ValueError, match=r"no usable training rows.*'question'|field "
                                         r"'nope'|no usable"):
        task(write_jsonl(tmp_path / "d.jsonl", ROWS), prompt={"field": "nope"})
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"question": "a", "answer": "1"}\n{not json\n')
    with pytest.raises(ValueError, match="broken.jsonl could not be read as json"):
        task(broken)


def test_held_out_by_fraction_file_and_split(tmp_path):
    import datasets

    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    t = task(path, eval_fraction=0.25, eval_size=8)
    held = {p.messages[0]["content"] for p in t.eval_problems()}
    assert len(held) == 8 and all(p.prompt_id < 0 for p in t.eval_problems())
    assert not held & set(every_prompt(t, 64))  # held-out rows are never trained on
    t = task(path, eval_path=str(write_jsonl(tmp_path / "e.jsonl", ROWS[:5])))
    assert len(t.eval_problems()) == 5
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS),
                          "test": datasets.Dataset.from_list(ROWS[:6])}).save_to_disk(
        str(tmp_path / "dd"))
    t = task(tmp_path / "dd", eval_split="test")
    assert len(t.eval_problems()) == 6
    with pytest.raises(ValueError, match="is a file with one split"):
        task(path, eval_split="test")


def test_long_prompts_are_skipped_or_refused(tmp_path):
    rows = ROWS[:5] + [{"question": "x" * 500, "answer": "1", "level": 0}]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    limit = PromptLimit(lambda text, messages: len(messages[-1]["content"]), 100)
    t = DatasetTask(DatasetTaskConfig(path=str(path), prompt={"field": "question"}), limit)
    assert t.skipped == {"prompt too long": 1}
    with pytest.raises(ValueError, match="prompt of 500 tokens, over the 100"):
        DatasetTask(DatasetTaskConfig(path=str(path), prompt={"field": "question"},
                                      long_prompts="error"), limit)


def test_streaming_reads_the_same_records_in_a_fixed_order(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    a = task(path, streaming=True, shuffle_buffer=8)
    got = every_prompt(a, 90)
    assert sorted(got[:40]) == sorted(r["question"] for r in ROWS)
    b = task(path, streaming=True, shuffle_buffer=8)
    assert [b.problem(i).messages[0]["content"] for i in (85, 3)] == [got[85], got[3]]


def test_a_run_config_takes_a_dataset_task(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    cfg = RunConfig.model_validate({
        "model": {"kind": "pretrained"},
        "task": {"source": "dataset", "path": str(path), "prompt": {"field": "question"}}})
    assert make_task(cfg.task).problem(0).reference
