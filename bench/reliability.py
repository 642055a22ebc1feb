"""Benchmark: the receiver under hostile requests, and planted secrets against everything kept.

Run from the repository root: ``python bench/reliability.py`` (``--quick`` for 1,000 requests and
one corpus). Needs PostgreSQL (``FLAKETRIAGE_TEST_POSTGRES``, default
``postgresql://postgres@127.0.0.1:5432/postgres``; a fresh database is made and dropped).

Fuzz: requests drawn at random (Hypothesis, no database of examples, a fresh seed every run) from
``tests/reliability/hostile.py`` (the recorded GitHub and Sentry payloads and a captured bundle's
event with hostile values in one to four places, check runs naming hundreds of bundles, earlier
delivery ids with new bodies) and from schemathesis's reading of the served OpenAPI document, all
signed correctly, half to a receiver on SQLite and half on PostgreSQL, in-process. Each is checked
by ``tests/reliability/probe.py``: goals are at least 10,000 requests, zero 5xx, zero crashes, no
row written for a refused or duplicate delivery, and every stored case readable afterwards
(``GET /v1/cases``, ``GET /v1/cases/{id}``: 200). The first request of each kind of problem is
printed, with how many more there were.

Secrets: the corpus of ``tests/reliability/corpus.py`` (at least 25 formats), drawn afresh each
round, planted in a real git project's environment, argv, output, config files, source and remote,
captured and triaged by the real CLI (``tests/reliability/planted.py``) and fed to a receiver:
goals are zero leaks in every stored object, the report and the API's answers, and the commit and
digests kept. Exits 1 on a miss.

    python bench/reliability.py [--quick] [--requests 10000] [--secret-rounds 3] [--only fuzz|secrets]
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from goals import check
from service_stack import postgres_database

GOAL_REQUESTS = 10_000
GOAL_FORMATS = 25


# -- fuzz -----------------------------------------------------------------------------------------
@contextmanager
def receiver(backend: str, store: Path, work: Path) -> Iterator[tuple[Any, Any]]:
    """(TestClient, Database) of a receiver on `backend`, as the tests' ``make_receiver`` builds it."""
    from fastapi.testclient import TestClient

    from flaketriage.orchestrator.app import create_app
    from flaketriage.orchestrator.service import Service
    from flaketriage.records import Database
    from flaketriage.settings import load_settings
    from flaketriage.work.dispatch import MemorySender
    from tests.reliability.probe import EVENTS_SECRET, GITHUB_SECRET, SENTRY_SECRET

    settings = load_settings(
        store=str(store),
        webhook_secret=EVENTS_SECRET.decode(),
        github_webhook_secret=GITHUB_SECRET.decode(),
        sentry_client_secret=SENTRY_SECRET.decode(),
        allowed_stores=[str(store)],
        max_body_kb=64,
    )
    with postgres_database() if backend == "postgresql" else _sqlite(work) as url:
        database = Database(url)
        database.upgrade()
        try:
            app = create_app(Service.assemble(settings, database, MemorySender()))
            with TestClient(app, raise_server_exceptions=False) as client:
                yield client, database
        finally:
            database.dispose()


@contextmanager
def _sqlite(work: Path) -> Iterator[str]:
    yield f"sqlite:///{work / 'service.db'}"


def fuzz(backend: str, count: int, work: Path) -> tuple[int, list[Any]]:
    """Send `count` hostile requests to a fresh receiver on `backend`: (sent, problems)."""
    from hypothesis import HealthCheck, Phase, given, settings

    from flaketriage.bundle.io import load_manifest
    from flaketriage.events import FailureEvent, StoreLocation
    from flaketriage.store import open_store
    from tests.orchestrator.conftest import FAIL_PY, KEY_PY, _capture
    from tests.reliability.hostile import Request, Sources, known, openapi_requests, openapi_schema, requests
    from tests.reliability.probe import EVENT_ID, Probe

    project = work / "project"
    project.mkdir()
    (project / "fail.py").write_text(FAIL_PY)
    (project / "key.py").write_text(KEY_PY)
    bundles = (_capture(project, "fail.py"), _capture(project, "key.py"))
    store = project / ".flaketriage"
    manifest = load_manifest(open_store(store, readonly=True), bundles[0])
    event = FailureEvent.for_manifest(manifest, StoreLocation.parse(store)).model_copy(
        update={"event_id": EVENT_ID}
    )
    sources = Sources(event=json.loads(event.body()), bundles=bundles, project=str(project))
    problems: list[Any] = []
    with receiver(backend, store, work) as (client, database):
        probe = Probe(client, database)
        for sequence in known(sources).values():  # what broke a promise before, then the random draws
            for request in sequence:
                problems.extend(probe.send(request))

        @given(request=requests(sources, openapi_requests(openapi_schema(), str(store))))
        @settings(
            max_examples=count,
            database=None,
            deadline=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        def send(request: Request) -> None:
            problems.extend(probe.send(request))

        send()
        problems.extend(probe.readable())
        return probe.sent, problems


def report_fuzz(results: dict[str, tuple[int, list[Any]]], seconds: float, goal: int) -> list[bool]:
    sent = sum(n for n, _ in results.values())
    print(
        f"fuzz: {sent:,} signed hostile requests in {seconds:.0f} s",
        f"({', '.join(f'{b} {n:,}' for b, (n, _) in results.items())})",
    )
    kinds: Counter[str] = Counter()
    for backend, (_, problems) in results.items():
        # One example of each kind of problem on each route (the first, so the smallest to read
        # is not promised), with how many there were.
        groups: dict[tuple[str, str, str], list[Any]] = {}
        for problem in problems:
            kinds[problem.kind] += 1
            route = problem.request.route if problem.request else "GET"
            groups.setdefault((problem.kind, route, problem.detail.split(" ")[0]), []).append(problem)
        for (kind, route, status), found in groups.items():
            shown = str(found[0])
            print(f"  [{backend}] {len(found)} x {kind} {status} on {route}; the first:")
            print(f"    {shown if len(shown) < 1500 else shown[:1500] + ' ...'}")
    return [
        check("requests sent", f"{sent:,}", ">=", f"{goal:,}", sent >= goal),
        check("server errors (5xx)", str(kinds["5xx"]), "==", "0", kinds["5xx"] == 0),
        check("crashes", str(kinds["crash"]), "==", "0", kinds["crash"] == 0),
        check(
            "refused or duplicate requests that wrote rows",
            str(kinds["rows on refusal"]),
            "==",
            "0",
            kinds["rows on refusal"] == 0,
        ),
        check(
            "stored cases unreadable", str(kinds["unreadable case"]), "==", "0", kinds["unreadable case"] == 0
        ),
    ]


# -- secrets --------------------------------------------------------------------------------------
def secrets_round(seed: int, work: Path) -> tuple[int, list[str], list[str]]:
    """One corpus drawn with `seed`, planted, captured, triaged and fed to a receiver: (formats,
    leaks, ordinary hex that was masked)."""
    from tests.reliability.corpus import secrets
    from tests.reliability.planted import plant_and_capture, stored_texts

    drawn = secrets(random.Random(seed))
    run = plant_and_capture(work / f"planted-{seed}", drawn)
    texts = [*stored_texts(run.store), ("the triage report", run.report), *api_answers(run, work)]
    leaks = [
        f"{secret.kind}: {window!r} in {where}"
        for secret in drawn
        for where, text in texts
        if (window := secret.leaks(text)) is not None
    ]
    everything = "\n".join(text for _, text in texts)
    kept = [f"commit {run.commit}", f"sha256 of the data: {run.digest}", run.bundle]
    return len(drawn), leaks, [k for k in kept if k not in everything]


def api_answers(run: Any, work: Path) -> list[tuple[str, str]]:
    """The receiver's answers about the run's bundle: the event, the case list, the case."""
    from flaketriage.bundle.io import load_manifest
    from flaketriage.events import FailureEvent, StoreLocation
    from flaketriage.signing import signed_headers
    from flaketriage.store import open_store
    from tests.reliability.probe import EVENTS_SECRET

    manifest = load_manifest(open_store(run.store, readonly=True), run.bundle)
    body = FailureEvent.for_manifest(manifest, StoreLocation.parse(run.store)).body()
    with receiver("sqlite", run.store, run.project.parent) as (client, _):
        posted = client.post("/v1/events", content=body, headers=signed_headers(EVENTS_SECRET, body))
        listed = client.get("/v1/cases")
        answers = [("POST /v1/events", posted.text), ("GET /v1/cases", listed.text)]
        for case in listed.json():
            answers.append((f"GET /v1/cases/{case['id']}", client.get(f"/v1/cases/{case['id']}").text))
    return answers


def report_secrets(rounds: list[tuple[int, list[str], list[str]]], seconds: float) -> list[bool]:
    formats = min(n for n, _, _ in rounds)
    leaks = [leak for _, found, _ in rounds for leak in found]
    masked = [m for _, _, lost in rounds for m in lost]
    print(
        f"secrets: {len(rounds)} corpora of {formats} formats planted, captured, triaged and served",
        f"in {seconds:.0f} s",
    )
    for line in [*leaks[:20], *masked[:5]]:
        print(f"  {line}")
    return [
        check("secret formats planted", str(formats), ">=", str(GOAL_FORMATS), formats >= GOAL_FORMATS),
        check("secrets found in bundles, reports or answers", str(len(leaks)), "==", "0", not leaks),
        check("commits and digests masked", str(len(masked)), "==", "0", not masked),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 requests and one corpus")
    parser.add_argument("--requests", type=int, help="requests in all, half per backend (default 10,000)")
    parser.add_argument("--secret-rounds", type=int, help="corpora drawn and planted (default 3)")
    parser.add_argument("--only", choices=("fuzz", "secrets"))
    args = parser.parse_args()
    # One warning a refused request: tens of thousands of lines that say only what the goals say.
    logging.getLogger("flaketriage.receiver").setLevel(logging.ERROR)
    count = args.requests or (1000 if args.quick else GOAL_REQUESTS)
    rounds = args.secret_rounds or (1 if args.quick else 3)
    ok: list[bool] = []
    with tempfile.TemporaryDirectory(prefix="flaketriage-reliability-") as tmp:
        work = Path(tmp)
        if args.only != "secrets":
            start = time.perf_counter()
            results = {}
            for backend in ("sqlite", "postgresql"):
                (work / backend).mkdir()
                results[backend] = fuzz(backend, (count + 1) // 2, work / backend)
            ok += report_fuzz(results, time.perf_counter() - start, count if args.quick else GOAL_REQUESTS)
        if args.only != "fuzz":
            start = time.perf_counter()
            seeds = [random.randrange(2**32) for _ in range(rounds)]
            print(f"secrets: seeds {seeds}")
            found = [secrets_round(seed, work) for seed in seeds]
            ok += report_secrets(found, time.perf_counter() - start)
    if args.quick and args.only != "secrets":
        print(f"  (quick: {count:,} requests asked for; a full run is held to {GOAL_REQUESTS:,})")
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
