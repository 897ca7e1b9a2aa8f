"""A lease's metadata as the worker decodes it from the wire (relayrl/contracts/leases.py)."""

import pytest

from relayrl.contracts.leases import _metadata

pytestmark = pytest.mark.unit


def test_metadata_is_a_json_object_and_anything_else_reads_as_none(caplog):
    assert _metadata("") == {}
    assert _metadata('{"a": 1, "b": [2]}') == {"a": 1, "b": [2]}
    assert _metadata("[1, 2]") == {} and "not a JSON object (list)" in caplog.text
    assert _metadata("{broken") == {} and "Expecting property name" in caplog.text
