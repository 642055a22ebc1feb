"""Benchmark: signed events per second and latency at the receiver, against a bare endpoint.

Run from the repository root: ``python bench/ingest.py`` (``--quick`` for shorter rounds). Needs
``redis-server``, ``wrk`` and PostgreSQL (``FLAKETRIAGE_TEST_POSTGRES``, default
``postgresql://postgres@127.0.0.1:5432/postgres``; a fresh database is made and dropped).

One uvicorn process serves both routes, as ``flaketriage serve`` serves them: ``POST /v1/events``
(the real receiver: signature, schema, store policy, the delivery, case, occurrence and work written
to PostgreSQL in one transaction by the receiver's intake process, then the triage task handed to
Redis) and ``POST /bench/bare`` (FastAPI returning 202 and nothing else). ``wrk`` sends pre-signed
events, every one a new failure (the most work per event), from 16 connections. Rounds are
interleaved (bare, events, bare again as the A/A row, events, ...), and the medians with their
spread are printed beside the goals: at least 1,000 events/s, p99 at most 50 ms, and at least half
the bare endpoint's throughput. Exits 1 on a miss.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from service_stack import free_port, postgres_database, redis_server, require_tools, service_env

GOAL_RATE = 1000.0
GOAL_P99_MS = 50.0
GOAL_RATIO = 0.5
SECRET = "bench-secret"
CONNECTIONS = 16

LUA = r"""
local reqs = {}
local i = 0
local counter = 0
function setup(thread)
  thread:set("id", counter)
  counter = counter + 1
end
function init(args)
  local n, k = 0, tonumber(args[2])
  for line in io.lines(args[1]) do
    if n % k == id then
      local body, ts, sig = line:match("([^\t]*)\t([^\t]*)\t([^\t]*)")
      table.insert(reqs, wrk.format("POST", args[3], {["Content-Type"] = "application/json",
        ["X-Flaketriage-Timestamp"] = ts, ["X-Flaketriage-Signature"] = sig}, body))
    end
    n = n + 1
  end
end
function request()
  i = i + 1
  if i > #reqs then i = 1 end
  return reqs[i]
end
"""


def serve(port: int) -> None:
    """The server process: the real app with a bare route beside it, served as ``flaketriage serve``
    serves it (`flaketriage.orchestrator.server.run`)."""
    from fastapi.responses import Response

    from flaketriage.orchestrator import server
    from flaketriage.orchestrator.app import create_app
    from flaketriage.orchestrator.service import build_service
    from flaketriage.settings import load_settings

    app = create_app(build_service(load_settings()))

    @app.post("/bench/bare", status_code=202)
    def bare() -> Response:
        return Response(status_code=202)

    server.run(app, host="127.0.0.1", port=port, log_level="warning")


def write_requests(path: Path, store: Path, count: int) -> None:
    """`count` signed events, each a new failure (its own fingerprint), one per line."""
    from flaketriage.bundle.manifest import Provenance
    from flaketriage.events import FailureEvent, FailureSummary, StoreLocation
    from flaketriage.signing import sign

    location = StoreLocation.parse(store)
    now = int(time.time())
    with path.open("w") as fh:
        for n in range(count):
            event = FailureEvent(
                bundle_id=uuid.uuid4().hex * 2,
                fingerprint=uuid.uuid4().hex * 2,
                failure=FailureSummary(
                    kind="exception", exception_type="ValueError", message=f"bad value {n}"
                ),
                command=("python", "train.py", "--steps", "1000"),
                store=location,
                provenance=Provenance(
                    ci_provider="github-actions", job="train", run_url="https://github.com/a/b/actions/runs/1"
                ),
            )
            body = event.body().decode()
            fh.write(f"{body}\t{now}\t{sign(SECRET.encode(), now, event.body())}\n")


def wrk(url: str, route: str, requests: Path, seconds: float, script: Path) -> dict[str, float]:
    done = subprocess.run(
        [
            "wrk",
            "-t2",
            f"-c{CONNECTIONS}",
            f"-d{seconds:.0f}s",
            "--latency",
            "-s",
            str(script),
            url,
            "--",
            str(requests),
            "2",
            route,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    text = done.stdout
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    return {
        "rate": rate,
        "p50": _ms(re.search(r"50%\s+([\d.]+\w+)", text).group(1)),  # type: ignore[union-attr]
        "p99": _ms(re.search(r"99%\s+([\d.]+\w+)", text).group(1)),  # type: ignore[union-attr]
        "errors": float(bad.group(1)) if bad else 0.0,
    }


def _ms(text: str) -> float:
    value, unit = re.match(r"([\d.]+)(\w+)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 s rounds instead of 8 s")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return 0
    require_tools("wrk", "redis-server")
    seconds = 3.0 if args.quick else 8.0
    work = Path(tempfile.mkdtemp(prefix="flaketriage-bench-"))
    script = work / "events.lua"
    script.write_text(LUA)
    results: dict[str, list[dict[str, float]]] = {"bare": [], "events": [], "bare (A/A)": []}
    with postgres_database() as database_url, redis_server() as broker_url:
        port = free_port()
        env = service_env(work / "store", database_url, broker_url, FLAKETRIAGE_WEBHOOK_SECRET=SECRET)
        server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)], env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url)
            warm = work / "warm.tsv"
            write_requests(warm, work / "store", 2000)
            wrk(url, "/v1/events", warm, 2, script)  # warm-up: connections, caches, query plans
            for _ in range(args.rounds):
                for variant in results:
                    requests = work / "requests.tsv"
                    route = "/v1/events" if variant == "events" else "/bench/bare"
                    write_requests(requests, work / "store", int(seconds * 4000))
                    results[variant].append(wrk(url, route, requests, seconds, script))
        finally:
            server.terminate()
            server.wait(timeout=30)
            shutil.rmtree(work, ignore_errors=True)
    return report(results, args.rounds, seconds)


def wait_ready(url: str) -> None:
    import httpx

    for _ in range(300):
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit("the receiver did not start")


def report(results: dict[str, list[dict[str, float]]], rounds: int, seconds: float) -> int:
    bare_rate = statistics.median(r["rate"] for r in results["bare"])
    print(
        f"ingest: {rounds} interleaved rounds of {seconds:.0f} s, {CONNECTIONS} connections, "
        "one uvicorn process and its intake process"
    )
    print(
        f"  {'variant':<12} {'req/s':>9} {'spread':>17} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'ratio':>7} {'non-2xx':>8}"
    )
    for variant, runs in results.items():
        rates = [r["rate"] for r in runs]
        rate = statistics.median(rates)
        p50 = statistics.median(r["p50"] for r in runs)
        p99 = statistics.median(r["p99"] for r in runs)
        errors = sum(r["errors"] for r in runs)
        print(
            f"  {variant:<12} {rate:>9.0f} {min(rates):>8.0f}-{max(rates):<8.0f} {p50:>8.2f} {p99:>8.2f} "
            f"{rate / bare_rate:>6.2f}x {errors:>8.0f}"
        )
    events = results["events"]
    rate = statistics.median(r["rate"] for r in events)
    p99 = statistics.median(r["p99"] for r in events)
    errors = sum(r["errors"] for r in events)
    checks = [
        (f"events/s {rate:.0f} >= {GOAL_RATE:.0f}", rate >= GOAL_RATE),
        (f"p99 {p99:.1f} ms <= {GOAL_P99_MS:.0f} ms", p99 <= GOAL_P99_MS),
        (f"events/bare {rate / bare_rate:.2f} >= {GOAL_RATIO}", rate / bare_rate >= GOAL_RATIO),
        (f"every event answered 2xx ({errors:.0f} others)", errors == 0),
    ]
    for text, ok in checks:
        print(f"  goal: {text}: {'ok' if ok else 'MISSED'}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
