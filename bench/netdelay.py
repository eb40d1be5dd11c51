"""A TCP proxy that delays every byte by a fixed time, as a network between machines would.

`python -m bench.netdelay --target HOST:PORT --delay-ms D` listens on a free port of
127.0.0.1, prints it on its first line, and forwards each connection to the target, holding
every chunk half of D in each direction: a request and its answer cross it D later than
directly, as across a network whose round trip is D. Chunks keep their order and a connection
keeps sending while earlier chunks wait, so the delay adds latency and takes no bandwidth.

The bench (`bench/run.py --net-delay-ms D`) puts one in front of PostgreSQL and one in front
of Redis for every process it starts. It runs in a process of its own, whose CPU shows in
the figures; `--net-delay-ms 0` measures the proxy alone.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float):
    loop = asyncio.get_running_loop()
    held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def send() -> None:
        while True:
            due, data = await held.get()
            if not data:
                break
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(send())
    try:
        while data := await reader.read(65536):
            held.put_nowait((loop.time() + delay_s, data))
    except ConnectionError:
        pass
    held.put_nowait((0.0, b""))
    with contextlib.suppress(ConnectionError):
        await sender
    writer.close()


async def serve(target_host: str, target_port: int, delay_ms: float) -> None:
    one_way = delay_ms / 2000

    async def connection(client_reader, client_writer) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection(target_host, target_port)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(_pipe(client_reader, server_writer, one_way),
                             _pipe(server_reader, client_writer, one_way),
                             return_exceptions=True)

    server = await asyncio.start_server(connection, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


class DelayProxy:
    """A proxy process in front of HOST:PORT; `port` is where to connect instead."""

    def __init__(self, target: str, delay_ms: float):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.netdelay", "--target", target, "--delay-ms",
             str(delay_ms)], cwd=ROOT, stdout=subprocess.PIPE, text=True,
            start_new_session=True)
        self.port = int(self.proc.stdout.readline())

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def through(url: str, proxy: DelayProxy) -> str:
    """`url` with its host and port replaced by the proxy's."""
    parts = urlsplit(url)
    credentials = parts.netloc.rpartition("@")[0]
    netloc = f"{credentials}@127.0.0.1:{proxy.port}" if credentials else f"127.0.0.1:{proxy.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def target_of(url: str, default_port: int) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or default_port}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="HOST:PORT to forward to")
    parser.add_argument("--delay-ms", type=float, required=True,
                        help="added to every round trip (half each way)")
    args = parser.parse_args()
    host, port = args.target.rsplit(":", 1)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(host, int(port), args.delay_ms))


if __name__ == "__main__":
    main()
