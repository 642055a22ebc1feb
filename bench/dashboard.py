"""Benchmark: the dashboard's pages with 10,000 cases, 1,000,000 occurrences and 10,000,000 test
results in PostgreSQL (goal: every page answers in at most 100 ms at the 95th percentile).

Run from the repository root: ``python bench/dashboard.py [--quick] [--requests 200] [--reseed]
[--drop] [--explain] [--database bench_dashboard]``. Needs ``redis-server`` and PostgreSQL
(``FLAKETRIAGE_TEST_POSTGRES`` names the server; the benchmark seeds a database of its own there).

**Data.** `dashboard_data` seeds the database ``bench_dashboard`` (``--quick``: 1,000 cases,
100,000 occurrences and 1,000,000 results in ``bench_dashboard_quick``) by SQL, through the real
migrations, and says how long it took; a later run reuses it while the scale, the seeder and the
schema's migrations are the same (``--reseed`` seeds it again, ``--drop`` drops it after); what
beat keeps up to date for the pages (the overview's failures per day) is brought up to date first.

**Timing.** The service as ``flaketriage serve`` serves it, on loopback, with PostgreSQL and Redis
(`dashboard_app`: the product's app plus a bare ``GET /bench/select1`` route running one
``SELECT 1``, the baseline, and a count of the SQL statements each request ran). One client asks
each page once per round, in a fresh random order every round (`paired.interleave`), after
``--warmup`` rounds: the overview, the cases list (plain, filtered, on a branch, its last page), a
case with thousands of occurrences and several triages, the tests (plain, filtered, on the busiest
branch, quarantined), a test's page, the commit grid, the quarantine and the runners; the
baseline twice (its second row is the A/A row: how far two identical routes differ here). A time
is the whole request as the client sees it (sent to the body read). Printed per page: p50 and p95
in ms beside the baseline's, the SQL statements one request ran (a count that grows with the rows
shown is an N+1), their time, the page's size. A page that is not built yet (its route answers
404) is "missing".

The goal, per page: p95 at most 100 ms; and at most `MAX_STATEMENTS` statements a request (a page
shows up to 50 rows: a query per row would pass it). Exits 1 on a miss, a missing page or an error
answer. For each page that missed (every page with ``--explain``), its slowest statement is printed
with its ``EXPLAIN (ANALYZE, BUFFERS)``, to say which index it lacks.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dashboard_app import PAGE, SQL_MS, STATEMENTS
from dashboard_data import Scale, ensure_seeded
from goals import check
from paired import interleave, percentile
from quarantine_fetch import wait_ready
from service_stack import ADMIN, Processes, free_port, redis_server, require_tools, service_env

GOAL_MS = 100.0
MAX_STATEMENTS = 30
BASELINE, AA = "SELECT 1 (baseline)", "SELECT 1 (A/A)"


@dataclass(frozen=True)
class Subjects:
    """What the pages are asked about, read from the seeded database."""

    heavy_cases: list[int]
    """The 20 triaged cases with the most occurrences (each triaged again and again: a triage
    for every 500 of its occurrences, five at most)."""
    tests: list[int]
    repository: str
    branch: str


def subjects(url: str, scale: Scale) -> Subjects:
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        heavy = [
            r[0]
            for r in conn.execute(
                "SELECT id FROM cases WHERE verdict IS NOT NULL ORDER BY occurrences DESC, id LIMIT 20"
            )
        ]
        tests = [r[0] for r in conn.execute("SELECT id FROM tests ORDER BY id")]
    return Subjects(heavy, tests, scale.repositories[0], scale.branches[0])


def pages(about: Subjects, rng: random.Random) -> dict[str, Callable[[], str]]:
    """Each page timed, and the path of its next request."""
    repo = about.repository
    return {
        BASELINE: lambda: "/bench/select1",
        AA: lambda: "/bench/select1",
        "overview": lambda: "/dashboard",
        "cases": lambda: "/dashboard/cases",
        "cases, filtered": lambda: f"/dashboard/cases?verdict=flaky&repository={repo}&sort=occurrences",
        "cases, on a branch": lambda: f"/dashboard/cases?branch={about.branch}&status=decided",
        "cases, last page": lambda: "/dashboard/cases?page=200",
        "case": lambda: f"/dashboard/cases/{rng.choice(about.heavy_cases)}",
        "tests": lambda: "/dashboard/tests",
        "tests, filtered": lambda: f"/dashboard/tests?repository={repo}&flaky=1",
        "tests, on a branch": lambda: f"/dashboard/tests?branch={about.branch}",
        "tests, quarantined": lambda: "/dashboard/tests?quarantined=yes",
        "test": lambda: f"/dashboard/tests/{rng.choice(about.tests)}",
        "grid": lambda: "/dashboard/grid",
        "quarantine": lambda: "/dashboard/quarantine",
        "runners": lambda: "/dashboard/runners",
    }


@dataclass(frozen=True)
class Sample:
    """One request: its time, status, the statements it ran and their time, its body's size."""

    ms: float
    status: int
    statements: int
    sql_ms: float
    size: int


@dataclass
class Page:
    """What a page's requests measured."""

    name: str
    state: str = "ok"
    """``ok``, ``missing`` (its route answers 404: not built yet) or ``error: ...``."""
    samples: list[Sample] = field(default_factory=list)

    @property
    def ms(self) -> list[float]:
        return [s.ms for s in self.samples]

    @property
    def statements(self) -> list[int]:
        return [s.statements for s in self.samples]


def probe(client: object, name: str, path: str) -> str:
    """Whether a page answers: ``ok``, ``missing``, or ``error: ...`` (its status and first line)."""
    answer = client.get(path, headers={PAGE: name})  # type: ignore[attr-defined]
    if answer.status_code == 200:
        return "ok"
    if answer.status_code == 404 and answer.headers.get("content-type", "").startswith("application/json"):
        return "missing"  # no route: the page is not built yet (a page's own 404 is HTML)
    first = answer.text.strip().splitlines()[0][:200] if answer.text.strip() else ""
    return f"error: {answer.status_code} {first}"


def measure(base: str, about: Subjects, requests: int, warmup: int) -> dict[str, Page]:
    """Every page that answers, asked `requests` times in interleaved rounds after `warmup` rounds."""
    import httpx

    paths = pages(about, random.Random(5))
    measured = {name: Page(name) for name in paths}
    with httpx.Client(base_url=base, timeout=30) as client:
        for name, path in paths.items():
            measured[name].state = probe(client, name, path())

        def ask(name: str) -> Callable[[], Sample]:
            def once() -> Sample:
                start = time.perf_counter()
                answer = client.get(paths[name](), headers={PAGE: name})
                ms = (time.perf_counter() - start) * 1000
                statements = int(answer.headers.get(STATEMENTS, -1))
                sql_ms = float(answer.headers.get(SQL_MS, "nan"))
                return Sample(ms, answer.status_code, statements, sql_ms, len(answer.content))

            return once

        live = {name: ask(name) for name, page in measured.items() if page.state == "ok"}
        for name, samples in interleave(live, requests, warmup=warmup, seed=2).items():
            page = measured[name]
            page.samples = samples
            failed = [s.status for s in samples if s.status != 200]
            if failed:
                page.state = f"error: {len(failed)} answers not 200 during the run ({sorted(set(failed))})"
    return measured


def report(measured: dict[str, Page], requests: int) -> bool:
    base = measured[BASELINE]
    b50, b95 = percentile(base.ms, 0.5), percentile(base.ms, 0.95)
    print(
        f"\n{requests} requests per page, interleaved (a fresh order every round); times in ms, the whole"
        " request as the client sees it"
    )
    header = (
        f"{'page':<20} | {'p50':>6} | {'p95':>6} | {'p95 / baseline':>14} | {'SQL':>7} | {'SQL ms':>6}"
        f" | {'KiB':>5}"
    )
    print(header)
    print("-" * len(header))
    for page in measured.values():
        if page.state != "ok":
            print(f"{page.name:<20} | {page.state}")
            continue
        p50, p95 = percentile(page.ms, 0.5), percentile(page.ms, 0.95)
        low, high = min(page.statements), max(page.statements)
        sql = f"{low}" if low == high else f"{low}-{high}"
        ratio = "" if page.name == BASELINE else f"{p95 / b95:.1f}x"
        print(
            f"{page.name:<20} | {p50:>6.1f} | {p95:>6.1f} | {ratio:>14} | {sql:>7} |"
            f" {statistics.median(s.sql_ms for s in page.samples):>6.1f} |"
            f" {statistics.median(s.size for s in page.samples) / 1024:>5.0f}"
        )
    aa = measured[AA]
    print(
        f"\nA/A: the baseline route against itself, p50 {b50:.1f} vs {percentile(aa.ms, 0.5):.1f} ms,"
        f" p95 {b95:.1f} vs {percentile(aa.ms, 0.95):.1f} ms: differences below that are noise."
    )
    ok = True
    for page in measured.values():
        if page.name in (BASELINE, AA):
            continue
        if page.state != "ok":
            ok &= check(f"{page.name} p95", page.state, "<=", f"{GOAL_MS:.0f} ms", False)
            continue
        p95 = percentile(page.ms, 0.95)
        ok &= check(f"{page.name} p95", f"{p95:.1f} ms", "<=", f"{GOAL_MS:.0f} ms", p95 <= GOAL_MS)
        most = max(page.statements)
        ok &= check(
            f"{page.name} SQL statements a request",
            f"{most}",
            "<=",
            f"{MAX_STATEMENTS}",
            0 < most <= MAX_STATEMENTS,
        )
    return ok


def explain(base: str, measured: dict[str, Page], every: bool) -> None:
    """The slowest statement of each page that missed (of every page with `every`), explained."""
    import httpx

    for page in measured.values():
        if page.state != "ok" or page.name in (BASELINE, AA):
            continue
        if not every and percentile(page.ms, 0.95) <= GOAL_MS and max(page.statements) <= MAX_STATEMENTS:
            continue
        answer = httpx.get(f"{base}/bench/explain", params={"page": page.name}, timeout=120)
        print(f"\n--- {page.name}: its slowest statement, explained\n{answer.text}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the data, 50 requests per page")
    parser.add_argument("--requests", type=int, default=None, help="timed requests per page (200)")
    parser.add_argument("--warmup", type=int, default=10, help="rounds asked first and dropped")
    parser.add_argument("--cases", type=int, default=None)
    parser.add_argument("--occurrences", type=int, default=None)
    parser.add_argument("--results", type=int, default=None)
    parser.add_argument("--database", default=None, help="the database seeded (bench_dashboard)")
    parser.add_argument("--reseed", action="store_true", help="seed the database again even if it is")
    parser.add_argument("--drop", action="store_true", help="drop the database at the end")
    parser.add_argument("--explain", action="store_true", help="explain every page's slowest statement")
    args = parser.parse_args()
    scale = Scale(cases=1_000, occurrences=100_000, results=1_000_000) if args.quick else Scale()
    scale = Scale(
        cases=args.cases or scale.cases,
        occurrences=args.occurrences or scale.occurrences,
        results=args.results or scale.results,
    )
    requests = args.requests or (50 if args.quick else 200)
    name = args.database or ("bench_dashboard_quick" if args.quick else "bench_dashboard")
    require_tools("redis-server")
    url = ensure_seeded(ADMIN, name, scale, reseed=args.reseed)
    try:
        about = subjects(url, scale)
        with tempfile.TemporaryDirectory(prefix="flaketriage-bench-") as tmp, redis_server() as broker_url:
            work = Path(tmp)
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            server = Processes(service_env(work / "store", url, broker_url), work)
            log = work / "serve.log"
            server.launch(
                [sys.executable, str(Path(__file__).with_name("dashboard_app.py")), "--port", str(port)],
                log=log,
            )
            try:
                wait_ready(base)
                print(
                    f"serving {name} at {base}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
                )
                measured = measure(base, about, requests, args.warmup)
                print(f"load average after: {os.getloadavg()[0]:.1f}")
                ok = report(measured, requests)
                explain(base, measured, args.explain)
            finally:
                server.stop()
                errors = [
                    line for line in log.read_text(errors="replace").splitlines() if "Traceback" in line
                ]
                if errors:
                    print(f"\nthe service logged {len(errors)} tracebacks; its log's end:")
                    print("\n".join(log.read_text(errors="replace").splitlines()[-40:]))
                    ok = False
    finally:
        if args.drop:
            from dashboard_data import drop

            drop(ADMIN, name)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
