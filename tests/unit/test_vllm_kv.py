"""The ticket a vLLM worker hands over with a moved sequence (rollout_svc/engines/vllm_kv.py), and
the setting that turns KV moves on; the move itself is tests/integration/
test_vllm_kv_migration.py."""

import msgspec
import pytest

from relayrl.config import RunConfig
from relayrl.contracts.codec import CodecError
from rollout_svc.engines.vllm_kv import KVTicket, park_params, pull_params

pytestmark = pytest.mark.unit
PARAMS = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[1, 2]],
          "remote_engine_id": "e1", "remote_host": "10.0.0.2", "remote_port": 5600,
          "remote_request_id": "r1"}


def test_a_ticket_round_trips_and_asks_to_pull():
    ticket = KVTicket(tokens=[5, 6, 7], version=3, params=dict(PARAMS))
    back = KVTicket.decode(ticket.encode())
    assert back == ticket
    pull = pull_params(back)
    assert pull["do_remote_prefill"] is True and pull["do_remote_decode"] is False
    assert pull["remote_block_ids"] == [[1, 2]] and pull["remote_engine_id"] == "e1"
    assert park_params() == {"do_remote_decode": True}


@pytest.mark.parametrize("change, field", [
    ({"tokens": []}, "vllm_kv_ticket.tokens"),
    ({"params": {k: v for k, v in PARAMS.items() if k != "remote_host"}}, "remote_host"),
    ({"version": -1}, "vllm_kv_ticket.version"),
    ({"params": {**PARAMS, "remote_port": 70000}}, "remote_port"),
    ({"params": {**PARAMS, "remote_host": ""}}, "remote_host"),
    ({"params": {**PARAMS, "remote_block_ids": [[1, -2]]}}, "remote_block_ids"),
    ({"params": {**PARAMS, "remote_block_ids": "1,2"}}, "remote_block_ids"),
    ({"params": {**PARAMS, "remote_num_tokens": 9}}, "remote_num_tokens"),
])
def test_a_damaged_ticket_is_refused_naming_the_field(change, field):
    wire = {"kind": "vllm_kv_ticket", "schema": 1, "tokens": [5], "version": 0,
            "params": PARAMS, **change}
    with pytest.raises(CodecError, match=field):
        KVTicket.decode(msgspec.msgpack.encode(wire))


def test_kv_transfer_needs_vllm_and_its_own_ports():
    base = {"model": {"kind": "pretrained"},
            "rollout": {"engine": {"kind": "vllm", "kv_transfer_base_port": 5600},
                        "num_workers": 2}}
    cfg = RunConfig.model_validate(base)
    assert sorted(p for name, p in cfg._ports().items() if "KV side channel" in name) == [
        5600, 5601]
    with pytest.raises(ValueError, match="'kv_transfer_base_port' is not a field of engine "
                       "'torch' \\(a field of vllm\\)"):
        RunConfig.model_validate({"rollout": {"engine": {"kv_transfer_base_port": 5600}}})
    clash = {**base, "rollout": {**base["rollout"], "base_port": 5601}}
    with pytest.raises(ValueError, match="5601"):
        RunConfig.model_validate(clash)
