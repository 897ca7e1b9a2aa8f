"""`relayrl health`, the probe containers run: 0 only while the service says SERVING."""

from grpc_health.v1 import health_pb2

from relayrl.runtime.grpc_util import free_ports, make_server
from relayrl_ops.cli import main


def test_health_exits_zero_only_while_serving(capsys):
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    assert main(["health", address, "--timeout", "1"]) == 1  # nothing listens yet
    server, health = make_server(address, [])
    server.start()
    try:
        health.set("", health_pb2.HealthCheckResponse.SERVING)
        assert main(["health", address]) == 0
        health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        assert main(["health", address]) == 1
    finally:
        server.stop(0)
    assert "not serving" in capsys.readouterr().out
