"""A latency and bandwidth proxy for TCP, to put a local S3 server "far away" (`bench s3`).

    python -m warmstart_dev.throttle --listen PORT --upstream PORT --latency-ms 20 --mbps 100

Every request costs one round trip: when a client starts sending after the server last
spoke (a new HTTP request on a kept-alive connection, or the first one), its bytes wait
`latency_ms` before they are forwarded; a new connection waits as long again (the TCP
handshake). Each connection is capped at `mbps` in each direction (a token bucket per
stream), which is what a single S3 GET stream gets from a distant endpoint; parallel
streams each get their own cap. It runs as its own process so that its work does not
share the interpreter lock with the client being measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator

READ = 256 * 1024


class Link:
    """One client connection and its upstream: who spoke last, and each direction's bucket."""

    def __init__(self, latency_s: float, bytes_per_s: float) -> None:
        self.latency_s = latency_s
        self.bytes_per_s = bytes_per_s
        self.server_spoke = True  # the next client bytes start a request

    async def pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, from_client: bool) -> None:
        next_t = time.monotonic()
        try:
            while data := await reader.read(READ):
                if from_client and self.server_spoke:
                    self.server_spoke = False
                    await asyncio.sleep(self.latency_s)
                if not from_client:
                    self.server_spoke = True
                now = time.monotonic()
                next_t = max(next_t, now) + len(data) / self.bytes_per_s
                writer.write(data)
                await writer.drain()
                if next_t > time.monotonic():
                    await asyncio.sleep(next_t - time.monotonic())
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()


async def serve(listen: int, upstream: int, latency_ms: float, mbps: float) -> None:
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        await asyncio.sleep(latency_ms / 1000)  # the handshake's round trip
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", upstream)
        except OSError:
            client_w.close()
            return
        link = Link(latency_ms / 1000, mbps * 1e6)
        await asyncio.gather(link.pump(client_r, up_w, True), link.pump(up_r, client_w, False))

    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()


@contextlib.contextmanager
def throttled(upstream_url: str, *, latency_ms: float, mbps: float) -> Iterator[str]:
    """Yield a URL that reaches `upstream_url` (http://127.0.0.1:PORT) through the proxy."""
    from warmstart.vllm.engine import free_port

    from .s3server import serving

    upstream = int(upstream_url.rsplit(":", 1)[1])
    port = free_port()
    args = ["--listen", str(port), "--upstream", str(upstream), "--latency-ms", str(latency_ms), "--mbps", str(mbps)]
    proc = subprocess.Popen([sys.executable, "-m", "warmstart_dev.throttle", *args])
    with serving(proc, port, "throttle proxy") as url:
        yield url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", type=int, required=True)
    parser.add_argument("--upstream", type=int, required=True)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--mbps", type=float, default=100.0, help="MB/s per connection and direction")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.listen, args.upstream, args.latency_ms, args.mbps))


if __name__ == "__main__":
    main()
