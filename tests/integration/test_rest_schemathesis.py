"""Property-based run of schemathesis against the control API's own OpenAPI schema, in
process (ASGI), in front of a real scheduler core and a real Redis: every operation gets
generated valid (positive) and invalid (negative) requests, with and without the token, and
no response is a server error or breaks the schema's promises (schemathesis' default checks
but negative_data_rejection: unknown query parameters are ignored, as HTTP APIs do, and the
token this test sends over the generated headers is not a schema violation).
"""

import json

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import negative_data_rejection

from relayrl.config import RunConfig
from relayrl.runtime.redis_conn import EmbeddedRedis, connect
from scheduler_svc import openapi
from scheduler_svc.core import SchedulerCore
from scheduler_svc.rest import build_rest_app

pytestmark = pytest.mark.integration
TOKEN = "fuzz-token"
OPERATIONS = sorted(f"{method.upper()} {path}"
                    for path, item in json.loads(openapi.render())["paths"].items()
                    for method in item)


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory):
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"))
    cfg = RunConfig.model_validate({
        "run_id": "fuzz", "scheduler": {"repack": True},
        "rollout": {"segment_tokens": 4},
        "buffer": {"group_size": 2}})
    core = SchedulerCore(cfg.scheduler_part(), connect(server.url))
    for w in ("w0", "w1"):  # something to list, drain and lease
        core.register(w, "here")
    core.acquire("w0", 2)
    yield schemathesis.openapi.from_asgi("/openapi.json", build_rest_app(core, TOKEN))
    server.shutdown()


@pytest.mark.parametrize("mode", list(GenerationMode), ids=lambda m: m.value)
@pytest.mark.parametrize("label", OPERATIONS)
def test_no_server_errors(api_schema, label, mode):
    operation = next(r.ok() for r in api_schema.get_all_operations() if r.ok().label == label)
    headers = {"Authorization": f"Bearer {TOKEN}"}

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=25, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case):
        case.call_and_validate(headers=headers, excluded_checks=[negative_data_rejection])

    run()
