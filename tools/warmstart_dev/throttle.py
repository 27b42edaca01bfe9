"""A latency, bandwidth and fault proxy for TCP, to put a local S3 server "far away" (`bench s3`)
or make it misbehave the way a real one does under load (the fault tests, `bench chaos`).

    python -m warmstart_dev.throttle --listen PORT --upstream PORT --latency-ms 20 --mbps 100
    python -m warmstart_dev.throttle --listen PORT --upstream PORT --fault slowdown --every 1

Every request costs one round trip: when a client starts sending after the server last
spoke (a new HTTP request on a kept-alive connection, or the first one), its bytes wait
`latency_ms` before they are forwarded; a new connection waits as long again (the TCP
handshake). Each connection is capped at `mbps` in each direction (a token bucket per
stream), which is what a single S3 GET stream gets from a distant endpoint; parallel
streams each get their own cap, and with `--total-mbps` all of them share one more (the
worker's link: `bench s3-weights` measures against it). It runs as its own process so that its work does not
share the interpreter lock with the client being measured.

Faults, each on every `every`-th request (counted over all connections, so a test with one
client stream knows which requests fail) or on a random share `rate` of them (`seed`):
- `slowdown`: answer `503 SlowDown` (S3's throttling reply) without forwarding the request;
- `cut`: forward, then close the connection once `cut_bytes` of the response went through
  (a body cut mid-read; responses shorter than that pass whole);
- `stall`: forward, then hold the response back for ever (past any read timeout);
- `refuse`: close the connection as soon as it is accepted (a connection reset);
- `notoken`: answer a ListObjectsV2 (`GET ...?list-type=2`) with an empty page that says
  `IsTruncated` but carries no `NextContinuationToken`, as a broken S3-compatible store does
  (drawn for listings only; other requests pass);
- `nouploads`: answer `501 NotImplemented` to every ListMultipartUploads (`GET ...?uploads`), as
  S3-compatible stores without that call do (on every such request, whatever `every` or `rate`).
`--fault` takes a comma-separated list: each faulted request draws one of them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

READ = 256 * 1024
FAULTS = ("slowdown", "cut", "stall", "refuse", "nouploads", "notoken")
NOT_IMPLEMENTED = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>NotImplemented</Code>'
    b"<Message>ListMultipartUploads is not implemented.</Message></Error>"
)
TRUNCATED_WITHOUT_TOKEN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
    b"<Name>bucket</Name><Prefix></Prefix><KeyCount>0</KeyCount><MaxKeys>1000</MaxKeys>"
    b"<IsTruncated>true</IsTruncated></ListBucketResult>"
)
SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message><RequestId>warmstart-fault</RequestId></Error>"
)


@dataclass
class Faults:
    """Which requests fail, and how: shared by every connection of one proxy."""

    kinds: tuple[str, ...] = ()
    every: int = 0  # every n-th request (0: use `rate`)
    rate: float = 0.0
    cut_bytes: int = 64 * 1024
    seed: int = 0
    stats: str = ""  # a JSON file kept up to date with the counts (for `bench chaos`)
    requests: int = 0
    injected: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.random = random.Random(self.seed)

    def draw(self, connect: bool = False, listing: bool = False) -> str | None:
        """The fault for the next connection (`refuse` only) or request (the others), or None.
        `notoken` is drawn for an object listing only."""
        kinds = [
            k for k in self.kinds if (k == "refuse") == connect and k != "nouploads" and (k != "notoken" or listing)
        ]
        if not kinds:
            return None
        self.requests += 1
        hit = self.requests % self.every == 0 if self.every else self.random.random() < self.rate
        if not hit:
            return None
        kind = self.random.choice(kinds)
        self.injected[kind] = self.injected.get(kind, 0) + 1
        if self.stats:
            tmp = f"{self.stats}.tmp"
            with open(tmp, "w") as handle:
                json.dump({"requests": self.requests, "injected": self.injected}, handle)
            os.replace(tmp, self.stats)
        return kind


class SharedCap:
    """One token bucket for every connection of a proxy (one event loop: no lock)."""

    def __init__(self, bytes_per_s: float) -> None:
        self.bytes_per_s = bytes_per_s
        self.next_t = time.monotonic()

    def take(self, n: int) -> float:
        """Book `n` bytes; the time they may be sent by."""
        self.next_t = max(self.next_t, time.monotonic()) + n / self.bytes_per_s
        return self.next_t


class Link:
    """One client connection and its upstream: who spoke last, and each direction's bucket."""

    def __init__(
        self,
        latency_s: float,
        bytes_per_s: float,
        faults: Faults | None = None,
        client: asyncio.StreamWriter | None = None,
        shared: SharedCap | None = None,
    ) -> None:
        self.shared = shared
        self.latency_s = latency_s
        self.bytes_per_s = bytes_per_s
        self.server_spoke = True  # the next client bytes start a request
        self.faults = faults or Faults()
        self.fault: str | None = None  # the current request's
        self.response_bytes = 0
        self.closed = asyncio.Event()
        self.client = client  # where a reply of ours goes (a slowdown's, a 501)

    async def pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, from_client: bool) -> None:
        next_t = time.monotonic()
        try:
            while data := await reader.read(READ):
                if from_client and self.server_spoke:
                    self.server_spoke = False
                    self.fault = self.faults.draw(listing=_lists_objects(data))
                    self.response_bytes = 0
                    if "nouploads" in self.faults.kinds and _lists_uploads(data):
                        await self.answer(reader, data, 501, "Not Implemented", NOT_IMPLEMENTED)
                        return
                    if self.fault == "notoken":
                        await self.answer(reader, data, 200, "OK", TRUNCATED_WITHOUT_TOKEN)
                        return
                    if self.fault == "slowdown":
                        await self.answer(reader, data, 503, "Slow Down", SLOWDOWN)
                        return
                    await asyncio.sleep(self.latency_s)
                if not from_client:
                    self.server_spoke = True
                    if self.fault == "stall":
                        await self.closed.wait()
                        return
                    if self.fault == "cut":
                        room = self.faults.cut_bytes - self.response_bytes
                        if len(data) >= room:
                            writer.write(data[: max(room, 0)])
                            await writer.drain()
                            return  # `finally` closes this side; the other pump ends with it
                    self.response_bytes += len(data)
                now = time.monotonic()
                next_t = max(next_t, now) + len(data) / self.bytes_per_s
                until = max(next_t, self.shared.take(len(data))) if self.shared is not None else next_t
                writer.write(data)
                await writer.drain()
                if until > time.monotonic():
                    await asyncio.sleep(until - time.monotonic())
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.closed.set()
            with contextlib.suppress(Exception):
                writer.close()

    async def answer(self, reader: asyncio.StreamReader, first: bytes, status: int, text: str, xml: bytes) -> None:
        """Read the request's head (and a body sent without `Expect: 100-continue`); the reply is ours."""
        head = first
        while b"\r\n\r\n" not in head:
            more = await reader.read(READ)
            if not more:
                return
            head += more
        head, _, body = head.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").lower().split("\r\n")
        length = next((int(x.split(":", 1)[1]) for x in lines if x.startswith("content-length:")), 0)
        if not any(x.startswith("expect:") for x in lines):
            with contextlib.suppress(asyncio.IncompleteReadError):
                await reader.readexactly(max(length - len(body), 0))
        assert self.client is not None
        self.client.write(
            f"HTTP/1.1 {status} {text}\r\nContent-Type: application/xml\r\nConnection: close\r\n"
            f"Content-Length: {len(xml)}\r\n\r\n".encode()
            + xml
        )
        await self.client.drain()  # the upstream never saw the request


def _lists_objects(head: bytes) -> bool:
    line = head.split(b"\r\n", 1)[0]
    return line.startswith(b"GET ") and b"list-type=2" in line.split(b" ")[1]


def _lists_uploads(head: bytes) -> bool:
    line = head.split(b"\r\n", 1)[0]
    return line.startswith(b"GET ") and b"?uploads" in line.split(b" ")[1]


async def serve(
    listen: int,
    upstream: int,
    latency_ms: float,
    mbps: float,
    faults: Faults | None = None,
    total_mbps: float = 0.0,
) -> None:
    faults = faults or Faults()
    shared = SharedCap(total_mbps * 1e6) if total_mbps > 0 else None

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if faults.draw(connect=True) == "refuse":
            client_w.transport.abort()  # a reset, not a clean close
            return
        await asyncio.sleep(latency_ms / 1000)  # the handshake's round trip
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", upstream)
        except OSError:
            client_w.close()
            return
        link = Link(latency_ms / 1000, mbps * 1e6, faults, client_w, shared)
        to_up = asyncio.ensure_future(link.pump(client_r, up_w, True))
        to_client = asyncio.ensure_future(link.pump(up_r, client_w, False))
        await asyncio.wait({to_up, to_client}, return_when=asyncio.FIRST_COMPLETED)
        for pending in (to_up, to_client):
            pending.cancel()
        for w in (up_w, client_w):
            with contextlib.suppress(Exception):
                w.close()

    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()


@contextlib.contextmanager
def throttled(
    upstream_url: str,
    *,
    latency_ms: float = 0.0,
    mbps: float = 10_000.0,
    total_mbps: float = 0.0,
    fault: str = "",
    every: int = 0,
    rate: float = 0.0,
    cut_bytes: int = 64 * 1024,
    seed: int = 0,
    stats: str = "",
) -> Iterator[str]:
    """Yield a URL that reaches `upstream_url` (http://127.0.0.1:PORT) through the proxy."""
    from warmstart.engine.ports import free_port

    from .s3server import serving

    upstream = int(upstream_url.rsplit(":", 1)[1])
    port = free_port()
    args = ["--listen", str(port), "--upstream", str(upstream), "--latency-ms", str(latency_ms), "--mbps", str(mbps)]
    if total_mbps > 0:
        args += ["--total-mbps", str(total_mbps)]
    if fault:
        args += ["--fault", fault, "--every", str(every), "--rate", str(rate), "--cut-bytes", str(cut_bytes)]
        args += ["--seed", str(seed), *(["--stats", stats] if stats else [])]
    proc = subprocess.Popen([sys.executable, "-m", "warmstart_dev.throttle", *args])
    with serving(proc, port, "throttle proxy") as url:
        yield url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", type=int, required=True)
    parser.add_argument("--upstream", type=int, required=True)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--mbps", type=float, default=100.0, help="MB/s per connection and direction")
    parser.add_argument("--total-mbps", type=float, default=0.0, help="MB/s for all connections together (0: none)")
    parser.add_argument("--fault", default="", help=f"comma-separated, of {', '.join(FAULTS)}")
    parser.add_argument("--every", type=int, default=0, help="fault every n-th request")
    parser.add_argument("--rate", type=float, default=0.0, help="else fault this share of requests")
    parser.add_argument("--cut-bytes", type=int, default=64 * 1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stats", default="", help="keep the fault counts in this JSON file")
    args = parser.parse_args()
    kinds = tuple(k for k in args.fault.split(",") if k)
    if unknown := set(kinds) - set(FAULTS):
        parser.error(f"unknown fault(s): {', '.join(sorted(unknown))}")
    faults = Faults(kinds, args.every, args.rate, args.cut_bytes, args.seed, args.stats)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.listen, args.upstream, args.latency_ms, args.mbps, faults, args.total_mbps))


if __name__ == "__main__":
    main()
