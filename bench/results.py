"""Benchmark: CI history at scale (goals: a 50,000-test JUnit file ingested end to end in at most 2 s;
a test's history page answered in at most 20 ms at the 95th percentile with 10,000,000 results).

Run from the repository root: ``python bench/results.py [--quick] [--tests 50000] [--rounds 7]
[--results 10000000] [--requests 300]``. Needs ``redis-server`` and PostgreSQL
(``FLAKETRIAGE_TEST_POSTGRES``; a fresh database is made and dropped).

**Ingest.** A real ``flaketriage serve`` on loopback (PostgreSQL, Redis) and a pytest-style JUnit
file of ``--tests`` tests (1% failing, 0.5% passed on a rerun). Each round, in a fresh random order
after a warm-up round, runs as a user runs them (a whole process each):

- ``parse``, the baseline: ``flaketriage results upload FILE --dry-run`` (the process, reading and
  checking the file, building the upload; nothing sent);
- ``parse (A/A)``: the baseline again, the noise;
- ``upload``: ``flaketriage results upload FILE`` with a new run id, until the service answered
  ``202`` (the upload signed and sent, validated, and every result committed to PostgreSQL).

The figure is the median wall time of ``upload``; the goal is met when it is at most 2 s. Beside it:
the per-round difference to ``parse`` (what sending and recording add).

**History.** The same database is seeded with ``--results`` results (100 per test, in upload
order, so one test's results lie far apart on disk, as in production) and ``GET /v1/tests/{id}``
is asked ``--requests`` times for random tests, interleaved with ``GET /healthz`` (the baseline:
what any request costs). The goal: the test page's 95th percentile at most 20 ms. Exits 1 on a miss.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from goals import check
from paired import interleave, percentile
from quarantine_fetch import wait_ready
from seed import History, seed_history
from service_stack import Processes, free_port, postgres_database, redis_server, require_tools, service_env

SECRET = "bench-secret"


def write_junit(path: Path, tests: int) -> None:
    """A pytest-style JUnit file: modules of 100 tests, 1% failing, 0.5% passed on a rerun."""
    rng = random.Random(7)
    suite = f'<testsuite name="pytest" errors="0" failures="0" skipped="0" tests="{tests}" time="1.0">'
    lines = ['<?xml version="1.0" encoding="utf-8"?>', "<testsuites>", suite]
    for i in range(tests):
        module, name = f"tests.test_module_{i // 100}", f"test_case_{i}"
        draw = rng.random()
        if draw < 0.01:
            body = '<failure message="AssertionError: assert 1 == 2">def test(): assert 1 == 2</failure>'
        elif draw < 0.015:
            body = '<flakyFailure message="flaky" type="AssertionError">first attempt</flakyFailure>'
        else:
            body = ""
        lines.append(
            f'<testcase classname="{module}" name="{name}" time="0.{i % 1000:03d}">{body}</testcase>'
        )
    lines += ["</testsuite>", "</testsuites>"]
    path.write_text("\n".join(lines), encoding="utf-8")


def cli(env: dict[str, str], *args: str) -> float:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "flaketriage", "results", "upload", *args],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    elapsed = time.perf_counter() - start
    if done.returncode != 0 or ("accepted" not in done.stderr and "--dry-run" not in " ".join(args)):
        raise SystemExit(f"results upload failed ({done.returncode}): {done.stderr[-2000:]}")
    return elapsed


def seed(database_url: str, results: int) -> int:
    """``results`` results: 100 runs of one suite of ``results // 100`` tests (`seed.History`);
    returns the number of tests (their ids are 1 to it, in this fresh database)."""
    import psycopg

    history = History(tests=max(1, results // 100), runs=100, days=200 / 1440, storms=0.0)
    url = database_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url, autocommit=True) as conn:
        seed_history(conn, history)
        conn.execute("VACUUM ANALYZE")
    return history.tests


def history(base: str, tests: int, requests: int) -> tuple[list[float], list[float]]:
    import httpx

    rng = random.Random(3)
    page: list[float] = []
    bare: list[float] = []
    with httpx.Client(base_url=base, timeout=10) as client:
        for _ in range(20):  # warm-up
            client.get(f"/v1/tests/{rng.randint(1, tests)}")
        for _ in range(requests):
            for name in rng.sample(["page", "bare"], 2):
                start = time.perf_counter()
                answer = client.get(f"/v1/tests/{rng.randint(1, tests)}" if name == "page" else "/healthz")
                elapsed = (time.perf_counter() - start) * 1000
                if answer.status_code != 200:
                    raise SystemExit(f"GET answered {answer.status_code}: {answer.text[:300]}")
                if name == "page" and len(answer.json()["recent"]) != 50:
                    raise SystemExit("a test page did not list its 50 latest results")
                (page if name == "page" else bare).append(elapsed)
    return page, bare


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds, 1,000,000 results, 100 requests")
    parser.add_argument("--tests", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--results", type=int, default=10_000_000)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--only", choices=("ingest", "history"), help="Run one of the two parts.")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.results, args.requests = 3, 1_000_000, 100
    require_tools("redis-server")
    ok = True
    with (
        tempfile.TemporaryDirectory() as tmp,
        postgres_database() as database_url,
        redis_server() as broker_url,
    ):
        work = Path(tmp)
        junit = work / "junit.xml"
        write_junit(junit, args.tests)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        env = service_env(work / "store", database_url, broker_url, FLAKETRIAGE_WEBHOOK_SECRET=SECRET)
        server = Processes(env, work)
        server.start("serve", "--port", str(port), log=work / "serve.log")
        try:
            wait_ready(base)
            if args.only != "history":
                client_env = {
                    k: v for k, v in os.environ.items() if not k.startswith(("FLAKETRIAGE_", "GITHUB_"))
                }
                client_env.update(
                    FLAKETRIAGE_SERVICE_URL=base,
                    FLAKETRIAGE_WEBHOOK_SECRET=SECRET,
                    NO_PROXY="127.0.0.1",
                    PYTHONPATH=env["PYTHONPATH"],
                )
                common = ["--repo", "acme/models", "--branch", "main", "--commit", "a" * 40, str(junit)]
                runs = iter(range(10**6))
                times = interleave(
                    {
                        "parse": lambda: cli(client_env, *common, "--dry-run"),
                        "parse (A/A)": lambda: cli(client_env, *common, "--dry-run"),
                        "upload": lambda: cli(client_env, *common, "--run-id", f"bench-{next(runs)}"),
                    },
                    args.rounds,
                )
                print(
                    f"ingest: {args.tests:,} tests, {junit.stat().st_size / 1e6:.1f} MB of JUnit XML,"
                    f" {args.rounds} rounds"
                )
                for name, values in times.items():
                    print(
                        f"  {name:12} median {statistics.median(values):.3f} s"
                        f"  (min {min(values):.3f}, max {max(values):.3f})"
                    )
                added = [u - p for u, p in zip(times["upload"], times["parse"], strict=True)]
                print(
                    f"  sending and recording add {statistics.median(added):.3f} s"
                    " (median of per-round differences)"
                )
                upload = statistics.median(times["upload"])
                ok &= check(
                    f"{args.tests:,}-test upload end to end, median",
                    f"{upload:.2f} s",
                    "<=",
                    "2 s",
                    upload <= 2.0,
                )
            if args.only != "ingest":
                tests = seed(database_url, args.results)
                page, bare = history(base, tests, args.requests)
                print(
                    f"history: GET /v1/tests/{{id}} over {args.results:,} results, {args.requests} requests"
                )
                for name, values in (("test page", page), ("/healthz", bare)):
                    p50, p95 = percentile(values, 0.5), percentile(values, 0.95)
                    print(f"  {name:10} p50 {p50:.1f} ms  p95 {p95:.1f} ms")
                p95 = percentile(page, 0.95)
                ok &= check("test history page p95", f"{p95:.1f} ms", "<=", "20 ms", p95 <= 20.0)
        finally:
            server.stop()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
