"""Benchmark: the receiver at 1x, 2x and 4x its sustainable rate, a minute each (issue 23).

Run from the repository root: ``python bench/overload.py`` (``--quick``: 10 s phases). Needs
``redis-server`` and PostgreSQL (``FLAKETRIAGE_TEST_POSTGRES``; a fresh database is made and
dropped). The receiver is ``flaketriage serve`` itself; no worker runs, so the receiver alone is
measured.

First the sustainable rate: what the receiver answers per second when 512 connections each send
their next event as soon as the last is answered (asked far more than it takes, for 8 s). Then an
open loop at 1x, 2x and 4x that rate, then at 1x again (the A/A row: is the receiver back to what it
took before the overload?): request i is due at ``start + i / rate`` whatever became of
the others, from up to 512 connections. A request sent late (every connection busy: the receiver is
behind) is timed from when it was due as well as from when it was sent, so waiting shows in the
figures; what was still unsent when the phase ended is counted as unsent. Every event is a new
failure, signed by this client just ahead of its send time (raw HTTP/1.1 on kept-alive
connections, so that the client costs little of the two cores; the rate it offered is printed
beside the rate asked).

Figures per phase: the rate asked, the rate offered (sent) and taken (answered 2xx), the status
counts, and the p50 / p99 of the accepted requests. Goals: no 5xx other than 503 in any phase, and
the queue drains after each: with no worker the broker's queues only grow, so what must drain is
the receiver's own (requests waiting for their transaction): every 2xx answered has its delivery in
PostgreSQL, and a fresh event sent after the phase is answered within 5 s. Exits 1 on a miss.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import itertools
import re
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from goals import check
from service_stack import Processes, free_port, postgres_database, redis_server, require_tools, service_env

SECRET = b"bench-secret"
PHASES = (("1x", 1), ("2x", 2), ("4x", 4), ("1x again", 1))
"""The last phase is the first again: whether the receiver is back to what it took before the overload."""
OPEN_CONNECTIONS = 512
PROBE_CONNECTIONS = OPEN_CONNECTIONS
"""The probe as busy as the phases can be: with fewer connections the receiver's batches are smaller
and it takes less (128 connections: 1,116 events/s, when 512 had 1,585 answered at 2x and 4x)."""
PROBE_RATE = 50_000.0
"""Far beyond what one receiver answers: the probe's answered rate is the receiver's capacity."""
TIMEOUT_S = 30.0
DRAIN_S = 5.0
_LENGTH = re.compile(rb"(?i)\r\ncontent-length:\s*(\d+)")


class SignedEvents:
    """Signed ``POST /v1/events`` requests, each a new failure, as raw HTTP/1.1 bytes."""

    def __init__(self, port: int, store: Path) -> None:
        from flaketriage.bundle.manifest import Provenance
        from flaketriage.events import FailureEvent, FailureSummary, StoreLocation

        event = FailureEvent(
            event_id="a" * 32,
            bundle_id="b" * 64,
            fingerprint="c" * 64,
            failure=FailureSummary(kind="exception", exception_type="ValueError", message="bad value 7"),
            command=("python", "train.py", "--steps", "1000"),
            store=StoreLocation.parse(store),
            provenance=Provenance(ci_provider="github-actions", job="train"),
        )
        self.template = event.body()
        self.port = port
        self.nonce = uuid.uuid4().hex

    def body(self, index: int) -> bytes:
        digest = hashlib.sha256(f"{self.nonce}:{index}".encode()).hexdigest()
        return (
            self.template.replace(b"a" * 32, digest[:32].encode())
            .replace(b"b" * 64, digest.encode())
            .replace(b"c" * 64, digest[::-1].encode())
        )

    def request(self, index: int) -> bytes:
        from flaketriage.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER

        body = self.body(index)
        now = int(time.time())
        signature = "sha256=" + hmac.new(SECRET, f"{now}.".encode() + body, hashlib.sha256).hexdigest()
        head = (
            f"POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nContent-Type: application/json\r\n"
            f"{TIMESTAMP_HEADER}: {now}\r\n{SIGNATURE_HEADER}: {signature}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body


@dataclass
class Phase:
    """What one phase sent and got back."""

    name: str
    asked_rate: float | None
    seconds: float
    scheduled: int = 0
    sent: int = 0
    status: Counter[int] = field(default_factory=Counter)
    """0: no answer (timed out or the connection dropped)."""
    service_ms: list[float] = field(default_factory=list)
    """Of 2xx answers: from sending to the answer."""
    due_ms: list[float] = field(default_factory=list)
    """Of 2xx answers: from when the request was due to the answer."""

    @property
    def accepted(self) -> int:
        return sum(n for code, n in self.status.items() if 200 <= code < 300)

    @property
    def bad_5xx(self) -> int:
        return sum(n for code, n in self.status.items() if code >= 500 and code != 503)


class Client:
    """Sends `SignedEvents` over kept-alive connections, each request due at its time."""

    def __init__(self, events: SignedEvents) -> None:
        self.events = events
        self.index = itertools.count()

    async def run(self, phase: Phase, connections: int) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time() + 0.2
        end = start + phase.seconds
        first = next(self.index)
        await asyncio.gather(*(self._connection(phase, start, end, first) for _ in range(connections)))
        if phase.asked_rate is not None:
            phase.scheduled = int(phase.asked_rate * phase.seconds)

    async def _connection(self, phase: Phase, start: float, end: float, first: int) -> None:
        loop = asyncio.get_running_loop()
        conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        while True:
            index = next(self.index)
            due = start if phase.asked_rate is None else start + (index - first) / phase.asked_rate
            if due >= end:
                break
            request = self.events.request(index)
            if due > loop.time():
                await asyncio.sleep(due - loop.time())
            sent = max(loop.time(), due)
            if sent >= end:
                break
            if conn is None:
                conn = await asyncio.open_connection("127.0.0.1", self.events.port)
            phase.sent += 1
            try:
                code = await asyncio.wait_for(self._exchange(conn, request), TIMEOUT_S)
            except (TimeoutError, OSError, asyncio.IncompleteReadError):
                code = 0
            if code == 0:
                conn[1].close()
                conn = None
            phase.status[code] += 1
            if 200 <= code < 300:
                answered = loop.time()
                phase.service_ms.append((answered - sent) * 1e3)
                phase.due_ms.append((answered - due) * 1e3)
        if conn is not None:
            conn[1].close()

    @staticmethod
    async def _exchange(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], request: bytes) -> int:
        reader, writer = conn
        writer.write(request)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        length = _LENGTH.search(head)
        if length:
            await reader.readexactly(int(length.group(1)))
        return int(head[9:12])


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def drained(port: int, database_url: str, accepted: int, events: SignedEvents) -> tuple[bool, str]:
    """Whether the receiver is through its backlog: every accepted delivery recorded, and a fresh
    event answered within `DRAIN_S`."""
    import httpx
    import psycopg

    recorded = 0
    deadline = time.monotonic() + DRAIN_S
    with psycopg.connect(database_url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            recorded = conn.execute("SELECT count(*) FROM deliveries").fetchone()[0]  # type: ignore[index]
            if recorded >= accepted:
                break
            time.sleep(0.1)
    request = events.request(10**12 + accepted)
    head, body = request.split(b"\r\n\r\n", 1)
    headers = dict(line.split(": ", 1) for line in head.decode().split("\r\n")[1:])
    started = time.monotonic()
    try:
        code = httpx.post(
            f"http://127.0.0.1:{port}/v1/events", content=body, headers=headers, timeout=DRAIN_S
        ).status_code
    except httpx.HTTPError:
        code = 0
    probe_s = time.monotonic() - started
    ok = recorded >= accepted and code in (200, 202) and probe_s <= DRAIN_S
    return (
        ok,
        f"{recorded}/{accepted} deliveries recorded, a fresh event answered {code} in {probe_s * 1e3:.0f} ms",
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 s phases and a 4 s rate probe")
    args = parser.parse_args()
    require_tools("redis-server")
    seconds, probe_s = (10.0, 4.0) if args.quick else (60.0, 8.0)
    work = Path(tempfile.mkdtemp(prefix="flaketriage-overload-"))
    with postgres_database() as database_url, redis_server() as broker_url:
        port = free_port()
        env = service_env(
            work / "store", database_url, broker_url, FLAKETRIAGE_WEBHOOK_SECRET=SECRET.decode()
        )
        procs = Processes(env, work)
        procs.start("serve", "--port", str(port), "--host", "127.0.0.1", log=work / "server.log")
        try:
            wait_ready(port)
            events = SignedEvents(port, work / "store")
            client = Client(events)
            warm = Phase("warm-up", PROBE_RATE, 2.0)  # connections, caches, query plans
            asyncio.run(client.run(warm, PROBE_CONNECTIONS))
            probe = Phase("probe", PROBE_RATE, probe_s)
            asyncio.run(client.run(probe, PROBE_CONNECTIONS))
            rate = probe.accepted / probe_s
            print(
                f"overload: sustainable rate {rate:.0f} events/s (answered with {PROBE_CONNECTIONS} "
                f"connections always busy, {probe_s:.0f} s); phases of {seconds:.0f} s"
            )
            accepted = warm.accepted + probe.accepted
            phases: list[Phase] = []
            drains: list[tuple[bool, str]] = []
            for name, multiple in PHASES:
                phase = Phase(name, rate * multiple, seconds)
                asyncio.run(client.run(phase, OPEN_CONNECTIONS))
                phases.append(phase)
                accepted += phase.accepted
                ok, text = drained(port, database_url, accepted, events)
                drains.append((ok, text))
                accepted += 1 if ok else 0  # the probe's delivery
        finally:
            procs.stop()
            shutil.rmtree(work, ignore_errors=True)
    return report(phases, drains, seconds)


def report(phases: list[Phase], drains: list[tuple[bool, str]], seconds: float) -> int:
    print(
        f"  {'phase':<8} {'asked/s':>8} {'sent/s':>8} {'2xx/s':>8} {'unsent':>8} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'p99 due':>9}  status counts"
    )
    for phase in phases:
        print(
            f"  {phase.name:<8} {phase.asked_rate or 0:>8.0f} {phase.sent / seconds:>8.0f} "
            f"{phase.accepted / seconds:>8.0f} {phase.scheduled - phase.sent:>8} "
            f"{percentile(phase.service_ms, 0.5):>8.1f} {percentile(phase.service_ms, 0.99):>8.1f} "
            f"{percentile(phase.due_ms, 0.99):>9.1f}  {dict(sorted(phase.status.items()))}"
        )
    print("  (p50/p99: accepted requests, from sending to the answer; p99 due: from when each was due)")
    checks = []
    for phase, (ok, text) in zip(phases, drains, strict=True):
        checks.append(
            check(f"{phase.name}: 5xx other than 503", str(phase.bad_5xx), "==", "0", phase.bad_5xx == 0)
        )
        print(f"  {phase.name}: {text}")
        checks.append(
            check(
                f"{phase.name}: receiver drained, fresh event answered within",
                "yes" if ok else "no",
                "<=",
                f"{DRAIN_S:.0f} s",
                ok,
            )
        )
    return 0 if all(checks) else 1


def wait_ready(port: int) -> None:
    import httpx

    for _ in range(300):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit("the receiver did not start")


if __name__ == "__main__":
    sys.exit(main())
