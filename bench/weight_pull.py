"""gRPC weight pull throughput against raw loopback TCP, measured in one run.

    python bench/weight_pull.py [--mb 64] [--repeats 3]

Ends with one JSON line: {"payload_mb", "tcp_gbps", "grpc_pull_gbps", "ratio"}.
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time

import torch

from relay_svc.server import RelayServicer, add_relay_servicer
from relayrl.grpc_util import make_server
from relayrl.weights import VersionStore
from relayrl.weights.client import RelayClient


def tcp_ceiling(payload: bytes) -> float:
    """Seconds to move `payload` once over a loopback socket."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]

    def send():
        conn, _ = srv.accept()
        conn.sendall(payload)
        conn.close()

    t = threading.Thread(target=send)
    t.start()
    cli = socket.create_connection(("127.0.0.1", port))
    buf = bytearray(len(payload))
    view = memoryview(buf)
    start = time.perf_counter()
    got = 0
    while got < len(payload):
        n = cli.recv_into(view[got:got + (1 << 20)])
        if n == 0:
            break
        got += n
    elapsed = time.perf_counter() - start
    t.join()
    cli.close()
    srv.close()
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    n = args.mb * (1 << 20) // 4
    tensors = {"w": torch.randn(n)}
    payload = tensors["w"].numpy().tobytes()

    store = VersionStore(2)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    address = f"127.0.0.1:{port}"
    server, _ = make_server(address, [(add_relay_servicer,
                                       RelayServicer(store, 1 << 20))])
    server.start()
    client = RelayClient(address)
    client.publish(1, 1, tensors)

    tcp = min(tcp_ceiling(payload) for _ in range(args.repeats))
    pulls = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        client.pull(1)
        pulls.append(time.perf_counter() - start)
    grpc_s = min(pulls)
    server.stop(0)
    gb = len(payload) / 1e9
    result = {"payload_mb": args.mb, "tcp_gbps": round(gb / tcp, 3),
              "grpc_pull_gbps": round(gb / grpc_s, 3), "ratio": round(tcp / grpc_s, 3)}
    print(f"raw TCP {result['tcp_gbps']} GB/s, gRPC pull (incl. checksum) "
          f"{result['grpc_pull_gbps']} GB/s")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
