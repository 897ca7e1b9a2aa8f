"""Every field of the run config refuses a wrong value by name, and no document at all can
make loading fail with anything but a ConfigError: the fields are enumerated from the models
themselves, so a field added later is covered without touching this test."""

from __future__ import annotations

import annotated_types
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from relayrl.config import ConfigError, RunConfig, load_run_config

pytestmark = pytest.mark.unit


def leaf_fields(model: type[BaseModel], prefix: tuple[str, ...] = ()):
    """(dotted path, FieldInfo) of every non-model field, nested sections walked."""
    for name, info in model.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from leaf_fields(ann, (*prefix, name))
        else:
            yield (*prefix, name), info


def sections(model: type[BaseModel], prefix: tuple[str, ...] = ()):
    yield prefix
    for name, info in model.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from sections(ann, (*prefix, name))


def nest(path: tuple[str, ...], value) -> dict:
    data: dict = {}
    node = data
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = value
    return data


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


@pytest.mark.parametrize("path", [p for p, _ in FIELDS], ids=".".join)
def test_a_wrongly_typed_value_names_its_field(tmp_path, path):
    # no field of any section accepts a mapping where a leaf value belongs
    with pytest.raises(ConfigError, match=r"\b" + r"\.".join(path) + r"\b"):
        load(tmp_path, nest(path, {"not": ["a", "value"]}))


@pytest.mark.parametrize("path,value", BOUNDED, ids=[f"{'.'.join(p)}={v}" for p, v in BOUNDED])
def test_a_value_past_a_bound_names_its_field(tmp_path, path, value):
    with pytest.raises(ConfigError, match=r"\b" + r"\.".join(path) + r"\b"):
        load(tmp_path, nest(path, value))


@pytest.mark.parametrize("prefix", list(sections(RunConfig)), ids=lambda p: ".".join(p) or "<top>")
def test_an_unknown_key_in_any_section_is_named(tmp_path, prefix):
    path = (*prefix, "no_such_field")
    with pytest.raises(ConfigError, match=r"\.".join(path)):
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
    for overrides in ([], [override], [f"trainer.lr={override}"]):
        try:
            load_run_config(path, overrides)
        except ConfigError as err:
            assert str(err).strip()
