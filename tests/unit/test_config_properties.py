"""Every field of the run config refuses a wrong value by name, and no document at all can
make loading fail with anything but a ConfigError: the fields are enumerated from the models
themselves, so a field added later is covered without touching this test."""

from __future__ import annotations

import types
import typing

import annotated_types
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from relayrl.config import ConfigError, RunConfig, load_run_config

pytestmark = pytest.mark.unit


class Tagged(str):
    """A path part holding one member of a tagged union (trainer.loss, task): nest() sets
    the member's discriminator (`name`, `source`) there."""

    key: str
    tag: str

    def __new__(cls, part: str, key: str, tag: str) -> Tagged:
        obj = super().__new__(cls, part)
        obj.key, obj.tag = key, tag
        return obj


def union_members(ann) -> list[type[BaseModel]]:
    """The models of a tagged union annotation, else none."""
    if typing.get_origin(ann) not in (typing.Union, types.UnionType):
        return []
    return [m for m in typing.get_args(ann) if isinstance(m, type) and issubclass(m, BaseModel)]


def optional_model(ann):
    """The model of an optional section (`Model | None`, e.g. rollout.environment), else ann."""
    members = union_members(ann)
    if len(members) == 1 and type(None) in typing.get_args(ann):
        return members[0]
    return ann


def leaf_fields(model: type[BaseModel], prefix: tuple[str, ...] = ()):
    """(dotted path, FieldInfo) of every non-model field, nested sections (optional ones
    too) and every member of a tagged union walked (its discriminator left out)."""
    for name, info in model.model_fields.items():
        ann = optional_model(info.annotation)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from leaf_fields(ann, (*prefix, name))
        elif members := union_members(ann):
            key = info.discriminator
            for m in members:
                for path, leaf in leaf_fields(m, (*prefix, Tagged(name, key, tag_of(m, key)))):
                    if path[-1] != key:
                        yield path, leaf
        else:
            yield (*prefix, name), info


def tag_of(member: type[BaseModel], key: str) -> str:
    return member.model_fields[key].default


def sections(model: type[BaseModel], prefix: tuple[str, ...] = ()):
    yield prefix
    for name, info in model.model_fields.items():
        ann = optional_model(info.annotation)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from sections(ann, (*prefix, name))
        for m in union_members(ann):
            key = info.discriminator
            yield from sections(m, (*prefix, Tagged(name, key, tag_of(m, key))))


# what a member of a tagged union needs besides the field under test
REQUIRED = {"dataset": {"path": "rows.jsonl"}, "reasoning_gym": {"generator": "chain_sum"}}


def nest(path: tuple[str, ...], value) -> dict:
    data: dict = {}
    node = data
    for part in path[:-1]:
        member = {part.key: part.tag, **REQUIRED.get(part.tag, {})} \
            if isinstance(part, Tagged) else {}
        node = node.setdefault(str(part), member)
    node[str(path[-1])] = value
    return data


def path_id(path: tuple[str, ...]) -> str:
    return ".".join(f"{p}[{p.tag}]" if isinstance(p, Tagged) else p for p in path) or "<top>"


def out_of_bounds(info) -> list:
    """Values just past each numeric bound declared on the field."""
    bad = []
    for m in info.metadata:
        if isinstance(m, annotated_types.Ge):
            bad.append(m.ge - 1 if isinstance(m.ge, int) else m.ge - 1e-3)
        elif isinstance(m, annotated_types.Gt):
            bad.append(m.gt)
        elif isinstance(m, annotated_types.Le):
            bad.append(m.le + 1 if isinstance(m.le, int) else m.le + 1e-3)
        elif isinstance(m, annotated_types.Lt):
            bad.append(m.lt)
    return bad


def load(tmp_path, data: dict) -> RunConfig:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_run_config(path)


FIELDS = list(leaf_fields(RunConfig))
BOUNDED = [(p, v) for p, info in FIELDS for v in out_of_bounds(info)]


def test_the_walk_finds_the_config():
    assert len(FIELDS) > 100 and len(BOUNDED) > 60


LEAVES = [p for p, info in FIELDS if typing.get_origin(info.annotation) is not dict]


@pytest.mark.parametrize("path", LEAVES, ids=path_id)
def test_a_wrongly_typed_value_names_its_field(tmp_path, path):
    # no field of any section accepts a mapping where a leaf value belongs (options do)
    with pytest.raises(ConfigError, match=r"\b" + r"\.".join(path) + r"\b"):
        load(tmp_path, nest(path, {"not": ["a", "value"]}))


@pytest.mark.parametrize("path,value", BOUNDED, ids=[f"{path_id(p)}={v}" for p, v in BOUNDED])
def test_a_value_past_a_bound_names_its_field(tmp_path, path, value):
    with pytest.raises(ConfigError, match=r"\b" + r"\.".join(path) + r"\b"):
        load(tmp_path, nest(path, value))


@pytest.mark.parametrize("prefix", list(sections(RunConfig)), ids=path_id)
def test_an_unknown_key_in_any_section_is_named(tmp_path, prefix):
    path = (*prefix, "no_such_field")
    match = r"\.".join(path)
    if prefix and isinstance(prefix[-1], Tagged):  # the member's own refusal, at the key
        match += rf" \({prefix[-1].tag}\): 'no_such_field' is not a field"
    with pytest.raises(ConfigError, match=match):
        load(tmp_path, nest(path, 1))


scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text()
documents = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                         | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=12)
FIXTURE_OK = [HealthCheck.function_scoped_fixture]  # tmp_path is only a scratch file
field_names = st.sampled_from([p for p, _ in FIELDS])


@settings(max_examples=300, deadline=None, suppress_health_check=FIXTURE_OK)
@given(path=field_names, value=documents)
def test_any_value_in_any_field_loads_or_is_refused_by_name(tmp_path, path, value):
    try:
        load(tmp_path, nest(path, value))
    except ConfigError as err:
        assert str(err).strip(), "a refusal must say what was wrong"


@settings(max_examples=200, deadline=None, suppress_health_check=FIXTURE_OK)
@given(text=st.text(max_size=200))
def test_any_file_text_loads_or_is_a_config_error(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    try:
        load_run_config(path)
    except ConfigError as err:
        assert str(path) in str(err) or "invalid config" in str(err)


@settings(max_examples=100, deadline=None, suppress_health_check=FIXTURE_OK)
@given(blob=st.binary(max_size=200), override=st.text(max_size=40))
def test_any_bytes_or_override_loads_or_is_a_config_error(tmp_path, blob, override):
    path = tmp_path / "c.yaml"
    path.write_bytes(blob)
    for overrides in ([], [override], [f"trainer.optimizer.lr={override}"]):
        try:
            load_run_config(path, overrides)
        except ConfigError as err:
            assert str(err).strip()
