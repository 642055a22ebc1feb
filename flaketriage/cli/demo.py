"""``flaketriage demo``: a small real project's two failures, triaged by the service as a team runs it.

It writes the demo project (`flaketriage.cli.demo_project`: a training run with a poisoned row, a
test that fails about 20% of the time), starts the embedded service (`EmbeddedService`: the
receiver, a Celery worker and beat on SQLite and the local broker file), captures both failures
with the real CLI and sends them as signed events (``flaketriage notify``, as CI does). The service
opens the cases, replays them on the worker, decides, minimizes, and files a Markdown issue and a
quarantine entry, all through the real pipeline, while the demo watches ``/v1/cases``. It prints
the verdicts and the dashboard's URL; in a terminal it keeps serving until Ctrl-C, elsewhere (CI, a
script) or with ``--no-serve`` it stops the service and exits.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from flaketriage.cli.console import err, labelled, out, plain, progress_bar
from flaketriage.cli.demo_project import write_project
from flaketriage.cli.embedded import EmbeddedService
from flaketriage.dependencies import require
from flaketriage.errors import EmbeddedServiceError, FlaketriageError, NotifyError
from flaketriage.process import interrupts

SERVICE_MODULES = ("fastapi", "uvicorn", "sqlalchemy", "alembic", "celery", "prometheus_client", "jinja2")
READY_TIMEOUT_S = 90.0
"""How long the receiver, its database and its broker have to come up."""
TRIAGE_TIMEOUT_S = 180.0
"""How long the service has to decide and report both cases (about half a minute is usual)."""
STORE = ".flaketriage"
PRIVATE_ENV_PREFIX = "FLAKETRIAGE_"


def run_demo(*, keep: bool = True, serve: bool | None = None, port: int | None = None) -> Path:
    """Run the whole loop on a fresh demo project; return its path. `serve` None: keep serving
    when stdout is a terminal."""
    for module in ("numpy", "pytest", *SERVICE_MODULES):
        require(module, "demo", "the demo")
    serving = sys.stdout.isatty() if serve is None else serve
    root = Path(tempfile.mkdtemp(prefix="flaketriage-demo-"))
    try:
        write_project(root)
        out.print(labelled("demo project", "bold", root))
        _run(root, serving=serving, port=port)
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    return root


def _run(root: Path, *, serving: bool, port: int | None) -> None:
    store = root / STORE
    secret = secrets.token_urlsafe(24)
    service = EmbeddedService(
        store=store,
        logs=store / "logs",
        env=_environment(store, FLAKETRIAGE_WEBHOOK_SECRET=secret),
        cwd=root,
        port=port,
    )
    with service:
        out.print(
            f"1. start the service: the receiver on {service.url}, a Celery worker and beat "
            f"(SQLite and the local broker in {STORE}/)"
        )
        bundles = _capture(root, store, service.check)
        service.wait_ready(READY_TIMEOUT_S)
        out.print("4. send both failures to the service, signed, as CI does: flaketriage notify --new")
        _send(root, store, service, secret)
        out.print("5. the service triages them: replays on the worker, a verdict, minimization, a report")
        cases = _decided(service, bundles)
        for case in cases:
            out.print(plain(f"   case {case['id']}: {case['title']}"))
            _describe(case["evidence"] or {})
        _where_to_look(service, cases, store)
        if serving:
            _serve(service)
        else:
            out.print(
                plain(
                    "\nthe service stops now (no terminal, or --no-serve). To see the dashboard again: "
                    f"flaketriage serve --store {store}, then http://127.0.0.1:8080/dashboard",
                    multiline=True,
                )
            )
    if serving:
        err.print("the service stopped")


def _environment(store: Path, **extra: str) -> dict[str, str]:
    """This environment without the user's FLAKETRIAGE_ settings (a team's database, broker or
    GitHub repository must not receive the demo's cases), the demo's store, and `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(PRIVATE_ENV_PREFIX)}
    return {**env, "FLAKETRIAGE_STORE": str(store), **extra}


# -- capturing and sending -------------------------------------------------------------------------
def _capture(root: Path, store: Path, check: Callable[[], None]) -> list[str]:
    out.print("2. capture the training run (one poisoned row drives the loss to inf)")
    env = _environment(store)
    cap = _flaketriage(
        root,
        ["capture", "--json", "--data", "data/train.csv", "--", sys.executable, "train.py", "--steps", "200"],
        env,
    )
    train_bundle = str(_last_json(cap, "capture")["bundle"])
    out.print(f"   captured bundle {train_bundle[:12]}")

    out.print("3. capture the flaky test (rerun until it fails once)")
    # The test needs no plugin: those installed here (some take seconds to load) stay out of its
    # runs, and the capture records this for its replays (about 20 of them).
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    test = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_flaky.py"]
    for _attempt in range(60):
        check()  # a service process that died is said now, not after the captures
        result = _last_json(_flaketriage(root, ["capture", "--json", "--", *test], env), "capture")
        if result["bundle"]:
            test_bundle = str(result["bundle"])
            out.print(f"   captured bundle {test_bundle[:12]}")
            return [train_bundle, test_bundle]
    raise FlaketriageError("the flaky demo test never failed in 60 runs; run the demo again")


def _send(root: Path, store: Path, service: EmbeddedService, secret: str) -> None:
    env = _environment(
        store, FLAKETRIAGE_NOTIFY_URL=f"{service.url}/v1/events", FLAKETRIAGE_WEBHOOK_SECRET=secret
    )
    proc = _flaketriage(root, ["notify", "--new", "--json", "--strict"], env)
    events = _last_json(proc, "notify").get("events")
    sent = (
        [e for e in events if isinstance(e, dict) and e.get("status") == "sent"]
        if isinstance(events, list)
        else []
    )
    if proc.returncode != 0 or len(sent) != 2:
        service.check()
        raise NotifyError(f"flaketriage notify sent {len(sent)} of 2 events: {_tail(proc.stderr)}")
    for event in sent:
        out.print(f"   sent bundle {str(event['bundle'])[:12]} (event {str(event['event_id'])[:12]})")


def _flaketriage(root: Path, args: Sequence[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``flaketriage ARGS`` in the project. Interrupted, it gets SIGTERM and time to end its own
    child (a capture's command) rather than a SIGKILL that would orphan it."""
    argv = [sys.executable, "-m", "flaketriage", *args]
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        hold = interrupts.Hold()
        try:
            proc = subprocess.Popen(argv, cwd=root, env=env, stdout=stdout, stderr=stderr)
        except BaseException:
            hold.release()
            raise
        try:
            hold.release()
            code = proc.wait()
        except BaseException:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
        outputs = []
        for stream in (stdout, stderr):
            stream.seek(0)
            outputs.append(stream.read().decode(errors="replace"))
    return subprocess.CompletedProcess(argv, code, outputs[0], outputs[1])


def _last_json(proc: subprocess.CompletedProcess[str], what: str) -> dict[str, Any]:
    for line in reversed(proc.stdout.strip().splitlines()):
        if line.startswith("{"):
            data: dict[str, Any] = json.loads(line)
            return data
    raise FlaketriageError(f"flaketriage {what} printed no JSON result: {_tail(proc.stderr or proc.stdout)}")


def _tail(text: str, lines: int = 3) -> str:
    return (
        " | ".join(line.strip() for line in text.strip().splitlines()[-lines:] if line.strip()) or "no output"
    )


# -- watching the service ----------------------------------------------------------------------------
def _decided(service: EmbeddedService, bundles: Sequence[str]) -> list[dict[str, Any]]:
    """Each bundle's case (``/v1/cases/{id}``) once the service has reported it, in their order."""
    import httpx

    ids: dict[str, int] = {}
    done: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + TRIAGE_TIMEOUT_S
    with httpx.Client(base_url=service.url, timeout=10) as client, progress_bar() as progress:
        task = progress.add_task("the service opens the cases", total=1)
        latest: dict[str, dict[str, Any]] = {}
        while len(done) < len(bundles):
            service.check()
            if time.monotonic() > deadline:
                raise EmbeddedServiceError(
                    f"the service reported {len(done)} of {len(bundles)} cases in {TRIAGE_TIMEOUT_S:.0f} s; "
                    f"its logs are in {service.logs}"
                )
            try:
                if len(ids) < len(bundles):
                    ids.update(_case_ids(client.get("/v1/cases").json(), bundles))
                cases = {b: client.get(f"/v1/cases/{ids[b]}").json() for b in ids if b not in done}
            except httpx.HTTPError:
                time.sleep(0.5)  # a receiver that died is said by the check above
                continue
            latest.update(cases)
            for bundle, case in cases.items():
                if case["status"] == "failed":
                    raise FlaketriageError(
                        f"the service could not triage case {case['id']}: {case['error']} "
                        f"(its logs are in {service.logs})"
                    )
                if case["status"] == "reported":
                    done[bundle] = case
            line, replays_done, replays_planned = _progress(latest.values())
            progress.update(task, description=line, completed=replays_done, total=max(1, replays_planned))
            time.sleep(0.5)
    return [done[b] for b in bundles]


def _case_ids(cases: list[dict[str, Any]], bundles: Sequence[str]) -> dict[str, int]:
    return {b: int(case["id"]) for case in cases for b in case["bundles"] if b in bundles}


def _progress(cases: Iterable[dict[str, Any]]) -> tuple[str, int, int]:
    """What the cases are at, in a line, and their replays done and planned (for the bar)."""
    parts, replays_done, replays_planned = [], 0, 0
    for case in cases:
        step = case.get("progress")
        if step:
            parts.append(f"case {case['id']}: {step['step']}")
            replays_done, replays_planned = (
                replays_done + step["replays_done"],
                replays_planned + step["replays_planned"],
            )
        else:
            parts.append(f"case {case['id']}: {case['status']}")
            replays = int((case.get("evidence") or {}).get("replays") or 0)
            replays_done, replays_planned = replays_done + replays, replays_planned + replays
    return "; ".join(parts) or "the service opens the cases", replays_done, replays_planned


def _describe(result: dict[str, Any]) -> None:
    rate = result["failure_rate"]
    out.print(
        f"   verdict [bold]{result['verdict']}[/bold] after {result['replays']} replays "
        f"(failure rate {rate['estimate']:.2f}, 95% interval {rate['low']:.2f}–{rate['high']:.2f})"
    )
    minimal = result.get("minimal")
    if isinstance(minimal, dict):
        for path, kept in minimal["data"].items():
            out.print(plain(f"   minimized {path}: kept {kept['kept']} of {kept['of']} rows"))
        for flag, change in minimal["args"].items():
            out.print(plain(f"   minimized {flag}: {change['from']} → {change['to']}"))
    if result.get("minimize_error"):
        err.print(plain(f"   not minimized: {result['minimize_error']}"))


def _where_to_look(service: EmbeddedService, cases: Sequence[dict[str, Any]], store: Path) -> None:
    out.print("\n[bold]where to look[/bold]")
    out.print(f"  dashboard: {service.url}/dashboard")
    for case in cases:
        out.print(f"  case {case['id']} ({case['verdict']}): {service.url}/dashboard/cases/{case['id']}")
    for case in cases:
        kind, location = case["report_kind"], case["report_url"]
        if kind == "quarantine":
            out.print(f"  quarantine: {service.url}/v1/quarantine")
        elif kind:
            out.print(plain(f"  {kind}: {location}"))
        else:
            out.print(f"  no report for case {case['id']} (verdict {case['verdict']})")
    out.print(plain(f"  cases: flaketriage cases --store {store}"))
    out.print(plain(f"  bundles: flaketriage bundle list --store {store}"))
    out.print(plain(f"  the service's logs: {service.logs}"))


def _serve(service: EmbeddedService) -> None:
    """Keep the service up until Ctrl-C (or SIGTERM, SIGHUP): the normal end, status 0."""
    out.print(f"\n[bold]serving[/bold] {service.url}/dashboard until Ctrl-C")
    try:
        while True:
            service.check()
            time.sleep(0.5)
    except (KeyboardInterrupt, interrupts.Terminated):
        err.print("stopping the service")
