"""The bench's network between machines (bench/netdelay.py): a proxy process that adds its
delay to every round trip and changes nothing else."""
import socket
import socketserver
import threading
import time

import pytest

from bench.netdelay import DelayProxy, target_of, through


class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def echo_server():
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def round_trips_ms(port: int, times: int = 20) -> list[float]:
    took = []
    with socket.create_connection(("127.0.0.1", port)) as sock:
        for k in range(times):
            t0 = time.perf_counter()
            sock.sendall(b"ping %d\n" % k)
            assert sock.recv(64) == b"ping %d\n" % k
            took.append((time.perf_counter() - t0) * 1000)
    return sorted(took)


@pytest.mark.parametrize("delay_ms", [0, 20])
def test_every_round_trip_takes_the_delay_more(echo_server, delay_ms):
    proxy = DelayProxy(echo_server, delay_ms)
    try:
        took = round_trips_ms(proxy.port)
    finally:
        proxy.stop()
    assert took[0] >= delay_ms * 0.95
    assert took[len(took) // 2] < delay_ms + 15  # a shared machine's scheduling, no more


def test_a_large_transfer_arrives_whole_and_in_order_while_its_chunks_wait(echo_server):
    payload = bytes(range(256)) * 8192  # 2 MiB: many chunks in flight at once
    proxy = DelayProxy(echo_server, 100)
    try:
        with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
            threading.Thread(target=sock.sendall, args=(payload,), daemon=True).start()
            received = bytearray()
            t0 = time.perf_counter()
            while len(received) < len(payload):
                received += sock.recv(1 << 20)
            took_s = time.perf_counter() - t0
    finally:
        proxy.stop()
    assert bytes(received) == payload
    # Pipelined: the delay once, not once per chunk (32 or more each way, 3.2 s or more).
    assert took_s < 1


def test_a_url_is_pointed_at_the_proxy_with_its_credentials_and_database_kept(echo_server):
    proxy = DelayProxy(echo_server, 0)
    try:
        assert through("postgres://root:pw@db.internal:5432/stepwise", proxy) == (
            f"postgres://root:pw@127.0.0.1:{proxy.port}/stepwise")
        assert through("redis://127.0.0.1:6379/14", proxy) == f"redis://127.0.0.1:{proxy.port}/14"
    finally:
        proxy.stop()
    assert target_of("postgres://root@127.0.0.1/x", 5432) == "127.0.0.1:5432"
    assert target_of("redis://cache:6380/0", 6379) == "cache:6380"
