"""Benchmark: how long one triage takes with one worker process, and with two.

Run from the repository root: ``python bench/workers.py`` (``--quick`` for fewer triages). Needs
``redis-server`` and PostgreSQL (``FLAKETRIAGE_TEST_POSTGRES``). Each triage replays a program that
computes for about 0.25 s of one core and then fails half the time (a flaky failure: 20 replays,
sent in batches of 6 that every worker takes from). The receiver, beat and the workers are real
processes; a triage's time is from its event to its verdict as the records show it (the triage
work row's creation to its finish). Configurations alternate round by round (1 worker, 2 workers,
1 worker again as the A/A row), each triage a new failure. Goal: two workers take at most 0.6 of
one worker's time (the ideal on this 2-core machine is 0.5). Exits 1 on a miss.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from service_stack import Processes, free_port, postgres_database, redis_server, require_tools, service_env

GOAL = 0.6
SECRET = "bench-secret"
PROGRAM = """\
import random, time

def flaky_{tag}():
    end = time.process_time() + 0.25
    x = 0
    while time.process_time() < end:
        x += 1
    if random.random() < 0.5:
        raise RuntimeError("flaky")

flaky_{tag}()
"""


def capture(project: Path, env: dict[str, str]) -> str:
    """A new failing bundle (retried until the flaky program fails once)."""
    import json
    import subprocess

    tag = "".join(chr(97 + int(c, 16) % 26) for c in uuid.uuid4().hex[:10])
    (project / "job.py").write_text(PROGRAM.format(tag=tag))
    for _ in range(50):
        done = subprocess.run(
            [sys.executable, "-m", "flaketriage", "capture", "--json", "--", sys.executable, "job.py"],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        bundle = json.loads(done.stdout.strip().splitlines()[-1])["bundle"]
        if bundle:
            return str(bundle)
    raise SystemExit("the flaky program never failed")


def triage_seconds(url: str, store: Path, bundle: str) -> float:
    import httpx

    from flaketriage.bundle.io import load_manifest
    from flaketriage.events import FailureEvent, StoreLocation
    from flaketriage.signing import signed_headers
    from flaketriage.store import LocalStore

    body = FailureEvent.for_manifest(
        load_manifest(LocalStore(store), bundle), StoreLocation.parse(store)
    ).body()
    response = httpx.post(
        f"{url}/v1/events", content=body, headers=signed_headers(SECRET.encode(), body), timeout=30
    )
    assert response.status_code == 202, response.text
    case_id = response.json()["cases"][0]
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        detail = httpx.get(f"{url}/v1/cases/{case_id}", timeout=10).json()
        runs = [r for r in detail["triage_runs"] if r["step"] == "triage" and r["finished_at"]]
        if runs:
            from datetime import datetime

            start = datetime.fromisoformat(runs[0]["created_at"])
            end = datetime.fromisoformat(runs[0]["finished_at"])
            return (end - start).total_seconds()
        time.sleep(0.1)
    raise SystemExit(f"case {case_id} was not decided in 600 s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of 2 triages")
    args = parser.parse_args()
    require_tools("redis-server")
    rounds, per_round = (2, 2) if args.quick else (3, 3)
    work = Path(tempfile.mkdtemp(prefix="flaketriage-bench-"))
    project = work / "project"
    project.mkdir()
    results: dict[str, list[float]] = {"1 worker": [], "2 workers": [], "1 worker (A/A)": []}
    with postgres_database() as database_url, redis_server() as broker_url:
        port = free_port()
        env = service_env(
            work / "store",
            database_url,
            broker_url,
            FLAKETRIAGE_WEBHOOK_SECRET=SECRET,
            FLAKETRIAGE_ISSUES_DIR=str(work / "issues"),
        )
        service = Processes(env, work)
        service.start("serve", "--port", str(port), log=work / "server.log")
        service.start("beat", log=work / "beat.log")
        url = f"http://127.0.0.1:{port}"
        import httpx

        for _ in range(200):
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        try:
            for _ in range(rounds):
                for variant in results:
                    workers = Processes(env, work)
                    for i in range(2 if variant.startswith("2") else 1):
                        workers.start("worker", "--concurrency", "1", log=work / f"worker{i}.log")
                    time.sleep(4)  # the workers connect and take their queues
                    try:
                        for _ in range(per_round):
                            results[variant].append(
                                triage_seconds(url, work / "store", capture(project, env))
                            )
                    finally:
                        workers.stop()
        finally:
            service.stop()
    one = statistics.median(results["1 worker"])
    print(
        f"workers: {rounds} interleaved rounds x {per_round} flaky triages (20 replays of ~0.25 s CPU each)"
    )
    print(f"  {'variant':<16} {'median s':>9} {'spread s':>15} {'ratio':>7}")
    for variant, times in results.items():
        median = statistics.median(times)
        print(f"  {variant:<16} {median:>9.2f} {min(times):>7.2f}-{max(times):<7.2f} {median / one:>6.2f}x")
    ratio = statistics.median(results["2 workers"]) / one
    ok = ratio <= GOAL
    print(f"  goal: 2 workers / 1 worker {ratio:.2f} <= {GOAL}: {'ok' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
