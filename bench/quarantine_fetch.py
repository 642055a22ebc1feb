"""Benchmark: what asking the service for its quarantine list costs a pytest session (goal: a session
answered 304 at most 250 ms slower than one reading the list from a file).

Run from the repository root: ``python bench/quarantine_fetch.py [--quick] [--rounds 11]
[--max-rounds 41] [--entries 200] [--tests 20]``. Needs ``redis-server`` and PostgreSQL
(``FLAKETRIAGE_TEST_POSTGRES``, default ``postgresql://postgres@127.0.0.1:5432/postgres``; a fresh
database is made and dropped).

A real ``flaketriage serve`` on loopback holds a quarantine list of ``--entries`` entries. The suite
(``--tests`` passing tests and one failing test that is on the list, so every session needs the
list and ends green with "1 quarantined") is run as a user runs it, ``pytest -q -p
no:cacheprovider --flaketriage`` (a whole process each time), four ways per round, in a fresh
random order after one warm-up round:

- ``file``, the baseline: the same list from ``FLAKETRIAGE_QUARANTINE_FILE`` (no request at all,
  what a session reading a cached copy without asking cost);
- ``file (A/A)``: the baseline again, the noise;
- ``service, 304``: ``FLAKETRIAGE_QUARANTINE_URL`` with the cached copy current, so the service
  answers ``304 Not Modified`` (every session but the first of a CI machine);
- ``service, 200``: the same with the cache deleted before the run (outside the timing), so the
  service sends the whole list (the first session, or the first after a change).

Each run is compared with the baseline run of its own round: the median of those per-pair
differences is the figure (milliseconds), with its quartiles, and the ratio beside it. The goal is
judged on the 304 session by the 95% confidence interval of the median difference (distribution
free, from order statistics): met when its upper end is at most 250 ms, missed when its lower end is
above; while it straddles 250 ms, rounds are added ten at a time up to ``--max-rounds``, and still
undecided then is a miss. The A/A interval must hold 0 ms. 250 ms is a twentieth of
``FLAKETRIAGE_QUARANTINE_FETCH_TIMEOUT_S`` (5 s) and a twentieth of the smallest session that asks
(one that captures a failure: the list is read at the first failure, so a passing session asks
nothing and pays nothing). Beside the figures: the fetch alone, in-process (`load_quarantine`, 200
and 304, the connection and TLS setup included), so the session's share of it is visible.
Exits 1 on a miss, or when a session did not report its quarantined test or the service did not
answer 304 to a current copy.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from goals import check
from paired import Spread, interleave
from service_stack import Processes, free_port, postgres_database, redis_server, require_tools, service_env

GOAL_MS = 250.0
BASE, AA, NOT_MODIFIED, FULL = "file", "file (A/A)", "service, 304", "service, 200"
FLAKY_ID = "test_suite.py::test_known_flaky"


def write_suite(root: Path, tests: int) -> None:
    body = ["def test_known_flaky():", '    assert False, "flaky again"', ""]
    for i in range(tests):
        body += [f"def test_{i}():", f"    assert {i} * 2 == {2 * i}", ""]
    (root / "test_suite.py").write_text("\n".join(body))


def quarantine_rows(database_url: str, entries: int) -> bytes:
    """Fill the service's quarantine table: `entries` entries, one of them the suite's failing
    test. Returns the document as the service serves it."""
    from flaketriage.quarantine import FailureRate, QuarantineDocument, QuarantineEvidence, refreshed_entry
    from flaketriage.records import Database, QuarantineRow

    evidence = QuarantineEvidence(
        verdict="flaky", replays=20, reproductions=3, rate=FailureRate(estimate=0.15, low=0.03, high=0.38)
    )
    made = {}
    for i in range(entries):
        test_id = FLAKY_ID if i == 0 else f"tests/test_module_{i // 20}.py::test_case_{i}"
        entry = refreshed_entry(
            None,
            fingerprint=f"{i:064x}",
            test_id=test_id,
            command=f"python -m pytest {test_id}",
            bundle_id=f"{i:064x}",
            evidence=evidence,
            reason="flaky: reproduced 3 of 20 replays",
            issue_url=f"https://github.com/acme/app/issues/{i + 1}",
            now=datetime(2024, 6, 10, 14, 0, tzinfo=UTC),
        )
        made[entry.fingerprint] = entry
    database = Database(database_url)
    with database.session() as session:
        for entry in made.values():
            session.add(QuarantineRow(fingerprint=entry.fingerprint, entry=entry.model_dump(mode="json")))
    return QuarantineDocument(entries=made).to_json()


def wait_ready(url: str) -> None:
    import httpx

    for _ in range(300):
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit("flaketriage serve did not start")


def run_once(root: Path, env: dict[str, str], drop: Path | None = None) -> float:
    """Wall seconds of one pytest session; `drop` (the cache) is deleted first, untimed."""
    if drop is not None:
        drop.unlink(missing_ok=True)
    start = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            "--flaketriage",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - start
    if done.returncode != 0 or "1 quarantined" not in done.stdout or "warning" in done.stdout:
        raise SystemExit(
            f"the session did not end green with its test quarantined ({done.returncode}):\n"
            f"{done.stdout[-3000:]}{done.stderr[-2000:]}"
        )
    return wall


def fetch_alone(url: str, store: Path, rounds: int) -> dict[str, float]:
    """Median milliseconds of `load_quarantine` in this process: the whole list, then a 304."""
    from flaketriage.ci.quarantine_list import CACHE_NAME, load_quarantine
    from flaketriage.settings import Settings

    settings = Settings(store=str(store), quarantine_url=url)
    times: dict[str, list[float]] = {"200": [], "304": []}
    for _ in range(rounds):
        for kind in ("200", "304"):
            if kind == "200":
                (store / CACHE_NAME).unlink(missing_ok=True)
            start = time.perf_counter()
            qlist, notes = load_quarantine(settings, store)
            times[kind].append((time.perf_counter() - start) * 1000)
            expected = url if kind == "200" else f"{url} (unchanged)"
            if notes or qlist.source != expected:
                raise SystemExit(f"the {kind} fetch read {qlist.source!r} with notes {notes}")
    return {kind: statistics.median(ms) for kind, ms in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds first (11; --quick 5)")
    parser.add_argument(
        "--max-rounds", type=int, default=None, help="rounds at most while undecided (41; --quick: --rounds)"
    )
    parser.add_argument("--quick", action="store_true", help="5 rounds: a smoke run, noisier")
    parser.add_argument("--entries", type=int, default=200, help="entries on the quarantine list")
    parser.add_argument("--tests", type=int, default=20, help="passing tests beside the quarantined one")
    args = parser.parse_args()
    rounds = args.rounds or (5 if args.quick else 11)
    max_rounds = max(rounds, args.max_rounds or (rounds if args.quick else 41))
    require_tools("redis-server")
    with (
        tempfile.TemporaryDirectory(prefix="flaketriage-bench-") as tmp,
        postgres_database() as database_url,
        redis_server() as broker_url,
    ):
        work = Path(tmp)
        port = free_port()
        server = Processes(service_env(work / "service-store", database_url, broker_url), work)
        server.start("serve", "--port", str(port), log=work / "serve.log")
        try:
            base_url = f"http://127.0.0.1:{port}"
            wait_ready(base_url)
            document = quarantine_rows(database_url, args.entries)
            return measure(args, rounds, max_rounds, work, f"{base_url}/v1/quarantine", document)
        finally:
            server.stop()


def measure(
    args: argparse.Namespace, rounds: int, max_rounds: int, work: Path, url: str, document: bytes
) -> int:
    import httpx

    from flaketriage.ci.quarantine_list import CACHE_NAME, fetch_url

    root = work / "project"
    root.mkdir()
    write_suite(root, args.tests)
    (work / "quarantine.json").write_bytes(document)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("FLAKETRIAGE_", "PYTEST_"))}
    clean["NO_PROXY"] = "127.0.0.1,localhost"

    def env(name: str, **extra: str) -> dict[str, str]:
        store = work / f"store-{name.replace(' ', '-').replace(',', '')}"
        return {**clean, "FLAKETRIAGE_STORE": str(store), **extra}

    by_file = {"FLAKETRIAGE_QUARANTINE_FILE": str(work / "quarantine.json")}
    by_service = {"FLAKETRIAGE_QUARANTINE_URL": url}
    envs = {BASE: env(BASE, **by_file), AA: env(AA, **by_file)}
    envs |= {NOT_MODIFIED: env(NOT_MODIFIED, **by_service), FULL: env(FULL, **by_service)}
    full_cache = Path(envs[FULL]["FLAKETRIAGE_STORE"]) / CACHE_NAME
    variants = {
        name: functools.partial(run_once, root, envs[name], full_cache if name == FULL else None)
        for name in envs
    }
    runs = interleave(variants, rounds)
    while _undecided(runs) and len(runs[BASE]) < max_rounds:
        more = interleave(variants, min(10, max_rounds - len(runs[BASE])), warmup=0, seed=len(runs[BASE]))
        for name, measured in more.items():
            runs[name].extend(measured)

    # The 304 sessions' cache must name the list the service serves, and the service must say so.
    cached = Path(envs[NOT_MODIFIED]["FLAKETRIAGE_STORE"]) / CACHE_NAME
    etag = json.loads(cached.read_text())["etag"]
    answer = fetch_url(url, 5.0, etag)
    alone = fetch_alone(url, work / "store-alone", max(rounds, 11))
    size = len(httpx.get(url, timeout=5).content)

    done = len(runs[BASE])
    diffs = {name: Spread.differences(runs[name], runs[BASE]) for name in (AA, NOT_MODIFIED, FULL)}
    ratios = {name: Spread.ratios(runs[name], runs[BASE]) for name in (AA, NOT_MODIFIED, FULL)}
    print(
        f"\nsession of {args.tests + 1} tests (one quarantined), a list of {args.entries} entries "
        f"({size / 1024:.0f} KiB), {done} interleaved rounds (+1 warm-up), per-pair differences\n"
    )
    print(f"{'variant':<14} | {'wall s':>6} | {'extra over the baseline, ms':<40} | ratio")
    print("-" * 120)
    print(f"{BASE:<14} | {statistics.median(runs[BASE]):>6.3f} | {'(baseline: the list from a file)':<40} |")
    for name in (AA, NOT_MODIFIED, FULL):
        spread = diffs[name]
        q1, q3 = spread.quartiles
        text = f"{spread.median * 1000:+.1f} (IQR {q1 * 1000:+.1f} to {q3 * 1000:+.1f})"
        print(
            f"{name:<14} | {statistics.median(runs[name]):>6.3f} | {text:<40} | {ratios[name].ratio_text()}"
        )
    low, high = (x * 1000 for x in diffs[NOT_MODIFIED].median_interval())
    aa_low, aa_high = (x * 1000 for x in diffs[AA].median_interval())
    print(
        f"\nThe fetch alone, in-process: {alone['200']:.1f} ms for the whole list, {alone['304']:.1f} ms "
        f"answered 304 (each with the cached copy read and rewritten).\n"
        f"95% interval of the 304 session's median extra: {low:+.1f} to {high:+.1f} ms; "
        f"A/A {aa_low:+.1f} to {aa_high:+.1f} ms ({done} rounds).\n"
    )
    verdict = "at most" if high <= GOAL_MS else ("above" if low > GOAL_MS else "not decided within")
    ok = [
        check(
            f"304 session's extra wall time over {done} rounds, median "
            f"{diffs[NOT_MODIFIED].median * 1000:+.1f} ms, {verdict} {GOAL_MS:.0f} ms with 95% confidence: "
            "upper end of its interval",
            f"{high:.1f} ms",
            "<=",
            f"{GOAL_MS:.0f} ms",
            high <= GOAL_MS,
        ),
        check(
            f"A/A interval {aa_low:+.1f} to {aa_high:+.1f} ms holds 0 (no side favoured): "
            "its distance from 0",
            f"{max(0.0, aa_low, -aa_high):.1f} ms",
            "==",
            "0.0 ms",
            aa_low <= 0.0 <= aa_high,
        ),
        check(
            "service's answer to the cached copy's ETag (304: not modified, no body)",
            f"{'304' if answer.body is None else '200'}",
            "==",
            "304",
            answer.body is None,
        ),
    ]
    return 0 if all(ok) else 1


def _undecided(runs: dict[str, list[float]]) -> bool:
    """Whether the 304 session's median extra still straddles the goal at 95% confidence."""
    low, high = Spread.differences(runs[NOT_MODIFIED], runs[BASE]).median_interval()
    return low * 1000 <= GOAL_MS < high * 1000


if __name__ == "__main__":
    sys.exit(main())
