"""A team's day through the production stack, in the order docs/service/deploy.md gives it.

PostgreSQL, Redis, the receiver, two workers and beat run as real processes (the ``stack`` fixture);
a small git project has the three failures a team meets: a flaky test, a deterministic data bug (one
bad CSV row, declared with the ``flaketriage_data`` marker) and an order-dependent test (a polluter
leaves global state its victim trips on), plus an integration step CI runs as a whole command under
``flaketriage capture``. CI runs ``pytest --flaketriage`` with the environment that page tells it
to set, the service triages what it captured, GitHub and Sentry report the same run,
``flaketriage cases`` shows the verdicts, the next CI run sees the quarantine, and ``flaketriage
doctor`` finds nothing wrong. Every step is asserted before the next one starts.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import API_TOKEN, GITHUB_SECRET, SENTRY_SECRET, WEBHOOK_SECRET, Stack

pytestmark = pytest.mark.slow

PAYLOADS = Path(__file__).parents[2] / "orchestrator" / "payloads"
"""The recorded GitHub and Sentry deliveries the receiver's own tests use."""

STACK_SETTINGS = {
    # A flaky verdict's rate interval from 8 replays in all instead of 20: the verdict is the same.
    "FLAKETRIAGE_FLAKY_RATE_REPLAYS": "8",
}

# What a GitHub Actions job exports: the plugin reads them as the bundle's provenance (its run URL).
GITHUB_RUN = {
    "GITHUB_ACTIONS": "true",
    "GITHUB_SERVER_URL": "https://github.com",
    "GITHUB_REPOSITORY": "Codertocat/Hello-World",
    "GITHUB_RUN_ID": "30433642",
    "GITHUB_RUN_ATTEMPT": "2",
    "GITHUB_JOB": "build",
}
RUN_URL = "https://github.com/Codertocat/Hello-World/actions/runs/30433642"  # the workflow_run payload's

FLAKY = "test_d_cache.py::test_cache_is_warm"
DATA_BUG = "test_c_prices.py::test_prices_are_positive"
POLLUTER = "test_a_settings.py::test_switches_to_debug"
INTEGRATION = "integration/test_retry.py::test_retry_succeeds"
VICTIM = "test_b_report.py::test_report_uses_release_mode"


class Flipper:
    """A Unix socket that answers ``fail`` and ``pass`` in turn, one answer per connection.

    The flaky test asks it whether to fail. Replays may write nothing outside their workspace, but a
    socket on a read-only mount can still be connected to, and the replays of one test are the only
    ones that ask it (the tests before the flaky one never connect; each flaky test has its own
    socket), so its replays fail and pass alternately: of any 4 replays in a row (one task's
    replays, or a batch the workers share) 2 fail and 2 pass, so the first replays already hold a
    pass and a failure. The sequential test then can only say ``flaky`` (deterministic needs no
    pass, not_reproduced no failure), every time, whatever order the workers take the replays in.
    /var/tmp because replays see a private /tmp.
    """

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="ft-flip-", dir="/var/tmp"))
        self.path = self.dir / "flip.sock"
        self.asked = 0
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_UNIX)
        self._sock.bind(str(self.path))
        os.chmod(self.path, 0o777)  # the sandbox may run the replay as another user
        self._sock.listen(16)
        threading.Thread(target=self._serve, daemon=True).start()

    def fail_next(self) -> None:
        """Make the next connection's answer ``fail``."""
        with self._lock:
            self.asked += self.asked % 2

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn, self._lock:
                conn.sendall(b"fail" if self.asked % 2 == 0 else b"pass")
                self.asked += 1

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self.path.unlink(missing_ok=True)
        self.dir.rmdir()


@pytest.fixture
def flipper() -> Iterator[Flipper]:
    flip = Flipper()
    yield flip
    flip.close()


@pytest.fixture
def flipper_integration() -> Iterator[Flipper]:
    flip = Flipper()  # a socket of its own: each flaky test's replays alternate on their own count
    yield flip
    flip.close()


def suite(flip: Path, flip_integration: Path) -> dict[str, str]:
    rows = ["sku,price", *(f"SKU-{i:04d},{(i % 40) + 1}.99" for i in range(200))]
    rows[138] = "SKU-0137,-4.00"  # the one bad row
    return {
        ".gitignore": ".flaketriage/\n__pycache__/\n",
        # The unit suite is what `pytest` collects; CI runs integration/ as a step of its own.
        "pytest.ini": "[pytest]\nnorecursedirs = .* integration\n",
        "data/prices.csv": "\n".join(rows) + "\n",
        "app_config.py": "MODE = 'release'\n",
        "test_a_settings.py": (
            "import app_config\n\n"
            "def test_loads_defaults():\n"
            "    assert app_config.MODE == 'release'\n\n"
            "def test_switches_to_debug():\n"
            "    app_config.MODE = 'debug'  # and never puts it back\n"
        ),
        "test_b_report.py": (
            "import app_config\n\n"
            "def test_report_uses_release_mode():\n"
            "    assert app_config.MODE == 'release', f'report built in {app_config.MODE} mode'\n"
        ),
        "test_c_prices.py": (
            "import csv\n"
            "from pathlib import Path\n\n"
            "import pytest\n\n"
            "DATA = Path(__file__).parent / 'data' / 'prices.csv'\n\n"
            "@pytest.mark.flaketriage_data('data/prices.csv')\n"
            "def test_prices_are_positive():\n"
            "    with DATA.open() as f:\n"
            "        for row in csv.DictReader(f):\n"
            "            price = float(row['price'])\n"
            "            assert price > 0, f\"bad price for {row['sku']}: {price}\"\n"
        ),
        "test_d_cache.py": (
            "import socket\n\n"
            "def test_cache_is_warm():\n"
            "    with socket.socket(socket.AF_UNIX) as s:\n"
            f"        s.connect({str(flip)!r})\n"
            "        answer = s.recv(16)\n"
            "    assert answer == b'pass', 'the cache was cold'\n"
        ),
        "integration/test_retry.py": (
            "import socket\n\n"
            "def test_retry_succeeds():\n"
            "    with socket.socket(socket.AF_UNIX) as s:\n"
            f"        s.connect({str(flip_integration)!r})\n"
            "        answer = s.recv(16)\n"
            "    assert answer == b'pass', 'the retry gave up'\n"
        ),
    }


def write_project(root: Path, flip: Path, flip_integration: Path) -> None:
    for name, text in suite(flip, flip_integration).items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "the team's project"], cwd=root, check=True)


def ci_env(stack: Stack) -> dict[str, str]:
    """What the production set-up page tells CI to set, and nothing of the service's own settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLAKETRIAGE_", "PYTEST_", "GITHUB_"))}
    env.pop("CI", None)
    env.update(
        GITHUB_RUN,
        FLAKETRIAGE_STORE=str(stack.store),  # the store the service reads (its FLAKETRIAGE_STORE)
        FLAKETRIAGE_NOTIFY_URL=f"{stack.url}/v1/events",
        FLAKETRIAGE_WEBHOOK_SECRET=WEBHOOK_SECRET,
        FLAKETRIAGE_QUARANTINE_URL=f"{stack.url}/v1/quarantine",
        FLAKETRIAGE_API_TOKEN=API_TOKEN,
        # Of the plugins installed here only flaketriage's (`-p flaketriage`): the others take
        # seconds to load, in this run and in each of the service's replays of what it captures.
        PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
        PYTHONUNBUFFERED="1",
    )
    return env


def ci_pytest(project: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    plugin = ["-p", "flaketriage", "--flaketriage", "-p", "no:cacheprovider"]
    return subprocess.run(
        [sys.executable, "-m", "pytest", *plugin, *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def ci_cli(project: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flaketriage", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def signed_post(stack: Stack, path: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{stack.url}{path}", content=body, headers=headers, timeout=30)


def github(stack: Stack, event: str, payload: dict[str, Any]) -> httpx.Response:
    body = json.dumps(payload).encode()
    signature = "sha256=" + hmac.new(GITHUB_SECRET.encode(), body, hashlib.sha256).hexdigest()
    headers = {
        "Content-Type": "application/json",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": str(uuid.uuid4()),
        "X-Hub-Signature-256": signature,
    }
    return signed_post(stack, "/webhooks/github", body, headers)


def sentry(stack: Stack, payload: dict[str, Any]) -> httpx.Response:
    body = json.dumps(payload).encode()
    headers = {
        "Content-Type": "application/json",
        "Sentry-Hook-Resource": "event_alert",
        "Sentry-Hook-Signature": hmac.new(SENTRY_SECRET.encode(), body, hashlib.sha256).hexdigest(),
        "Request-ID": str(uuid.uuid4()),
    }
    return signed_post(stack, "/webhooks/sentry", body, headers)


def payload(name: str) -> dict[str, Any]:
    data = json.loads((PAYLOADS / name).read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def test_a_teams_day_through_the_service(
    stack: Stack, flipper: Flipper, flipper_integration: Flipper
) -> None:
    project = stack.root / "team-project"
    project.mkdir()
    write_project(project, flipper.path, flipper_integration.path)
    env = ci_env(stack)

    # 1. The set-up is right before any CI run sends with it.
    doctor = ci_cli(project, env, "doctor")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    checks = {line.split()[1]: line.split()[0] for line in doctor.stdout.splitlines() if line.strip()}
    assert checks["settings"] == checks["service"] == checks["secret"] == "ok", doctor.stdout
    assert "ok      allowed stores" in doctor.stdout and "problem" not in doctor.stdout

    # 2. CI runs the suite: three failures, each captured and sent, signed, to the receiver.
    run = ci_pytest(project, env)
    assert run.returncode == 1, run.stdout + run.stderr
    assert re.search(r"3 failed, 2 passed", run.stdout), run.stdout
    summary = re.search(r"flaketriage: captured 3 failure\(s\): ([0-9a-f ]+) \(sent: yes\)", run.stdout)
    assert summary, run.stdout
    assert "flaketriage: error" not in run.stdout + run.stderr
    listed = ci_cli(project, env, "bundle", "list", "--json")
    bundles = {b["test_id"]: b["id"] for b in json.loads(listed.stdout)}
    assert set(bundles) == {FLAKY, DATA_BUG, VICTIM}, listed.stdout
    assert {b[:12] for b in bundles.values()} == set(summary.group(1).split())

    # CI's integration step runs as a whole command under capture (no plugin): one bundle for it.
    step = ci_cli(project, env, "capture", "--json", "--", sys.executable, "-m", "pytest", "integration")
    assert step.returncode == 1, step.stdout + step.stderr
    whole = json.loads(step.stdout.strip().splitlines()[-1])["bundle"]
    assert whole, step.stdout + step.stderr

    # 3. The workers triage each: a verdict and its report.
    flaky = stack.wait_case(bundles[FLAKY], timeout=150)
    bug = stack.wait_case(bundles[DATA_BUG], timeout=150)
    victim = stack.wait_case(bundles[VICTIM], timeout=150)

    # (a) flaky, with a rate and its interval: quarantined.
    assert flaky["verdict"] == "flaky" and flaky["report_kind"] == "quarantine", flaky
    flaky_detail = stack.get(f"/v1/cases/{flaky['id']}")
    rate = flaky_detail["evidence"]["failure_rate"]
    assert 0 < rate["low"] <= rate["estimate"] <= rate["high"] < 1, rate
    assert flaky_detail["occurrence_list"][0]["provenance"]["run_url"] == RUN_URL
    triage_runs = [w for w in flaky_detail["triage_runs"] if w["step"] == "triage"]
    outcomes = [r["outcome"] for w in triage_runs for r in w["replays"]]
    assert outcomes.count("reproduced") == outcomes.count("passed") == 4, outcomes  # 8 replays, in turn

    # (b) deterministic: a Markdown issue with the reproduction.
    assert bug["verdict"] == "deterministic" and bug["report_kind"] == "markdown", bug
    bug_issue = Path(bug["report_url"]).read_text()
    assert "bad price for SKU-0137: -4.0" in bug_issue and DATA_BUG in bug_issue
    assert "## Minimal reproduction" in bug_issue and "flaketriage bundle export " in bug_issue
    assert "- `data/prices.csv`: kept 1 of 200" in bug_issue, bug_issue  # the one bad row
    assert "· seen 1 time ·" in bug_issue and bug["occurrences"] == 1

    # (c) order-dependent, naming the polluter: an issue, and the victim quarantined.
    assert victim["verdict"] == "order_dependent" and victim["report_kind"] == "markdown", victim
    victim_detail = stack.get(f"/v1/cases/{victim['id']}")
    assert victim_detail["evidence"]["polluters"] == [POLLUTER], victim_detail["evidence"]
    [order_triage] = [w for w in victim_detail["triage_runs"] if w["step"] == "triage"]
    alone = [r["outcome"] for r in order_triage["replays"]]
    assert alone.count("passed") >= 5 and "reproduced" in alone, alone  # alone, then after the polluter
    assert victim_detail["progress"] is None  # nothing under way once reported
    victim_issue = Path(victim["report_url"]).read_text()
    assert POLLUTER in victim_issue and f"python -m pytest -p no:randomly {POLLUTER} {VICTIM}" in victim_issue

    entries = stack.get("/v1/quarantine")["entries"]
    by_test = {entry["test_id"]: entry for entry in entries.values()}
    assert set(by_test) == {FLAKY, VICTIM}, entries
    assert by_test[FLAKY]["reason"].startswith("flaky"), by_test[FLAKY]
    assert by_test[VICTIM]["reason"].startswith("order_dependent: ")
    assert by_test[VICTIM]["polluters"] == [POLLUTER]
    assert by_test[VICTIM]["issue_url"] == victim["report_url"]

    # 4. GitHub reports the same run failed: the workflow run opens its own case.
    workflow = payload("github_workflow_run.completed.json")
    assert workflow["workflow_run"]["html_url"] == RUN_URL
    answered = github(stack, "workflow_run", workflow)
    assert answered.status_code == 200 and answered.json()["outcome"] == "recorded", answered.text
    [run_case] = answered.json()["cases"]
    run_detail = stack.get(f"/v1/cases/{run_case}")
    assert (run_detail["kind"], run_detail["status"]) == ("workflow", "open")
    assert run_detail["occurrence_list"][0]["provenance"]["run_url"] == RUN_URL
    # The run and the failures captured in it name each other.
    assert {c["id"] for c in run_detail["linked_cases"]} >= {flaky["id"], bug["id"], victim["id"]}
    assert {c["run_url"] for c in run_detail["linked_cases"]} == {RUN_URL}
    links = {c["id"]: c for c in stack.get(f"/v1/cases/{bug['id']}")["linked_cases"]}
    assert links[run_case]["kind"] == "workflow" and links[run_case]["run_url"] == RUN_URL, links

    # A check run naming the captured bundles is one more occurrence of each case, no new triage.
    check = payload("github_check_run.completed.json")
    named = [*bundles.values(), whole]
    check["check_run"]["output"]["summary"] = "".join(f"flaketriage-bundle: {b}\n" for b in named)
    answered = github(stack, "check_run", check)
    assert answered.status_code in (200, 202), answered.text
    assert set(answered.json()["cases"]) >= {flaky["id"], bug["id"], victim["id"]}
    assert stack.case_for(bundles[DATA_BUG])["occurrences"] == 2  # type: ignore[index]

    # The check run is the first the service hears of the integration step's bundle: its triage
    # says flaky, and the test the whole run failed is quarantined by its id.
    integration = stack.wait_case(whole, timeout=150)
    assert integration["verdict"] == "flaky" and integration["report_kind"] == "quarantine", integration
    quarantined = stack.get("/v1/quarantine")["entries"].values()
    [whole_entry] = [e for e in quarantined if INTEGRATION in e.get("tests", [])]
    assert whole_entry["reason"].startswith("flaky"), whole_entry

    # 5. Sentry alerts on the same exception through the same code, from a checkout elsewhere: it
    # is the test's case (one failure, whichever source saw it), not a new one.
    alert = payload("sentry_event_alert.triggered.json")
    alert["data"]["event"]["exception"]["values"][-1] |= {
        "type": "AssertionError",
        "module": "builtins",
        # What the test raised, as pytest's assertion rewriting words it.
        "value": "bad price for SKU-0137: -4.0\nassert -4.0 > 0",
    }
    frame = alert["data"]["event"]["exception"]["values"][-1]["stacktrace"]["frames"][-1]
    frame |= {"filename": "test_c_prices.py", "abs_path": "/srv/app/test_c_prices.py", "lineno": 12}
    frame |= {"function": "test_prices_are_positive", "module": "test_c_prices", "vars": {}}
    alert["data"]["event"]["exception"]["values"][-1]["stacktrace"]["frames"] = [frame]
    answered = sentry(stack, alert)
    assert answered.status_code in (200, 202), answered.text
    assert answered.json()["cases"] == [bug["id"]], answered.text
    assert stack.case_for(bundles[DATA_BUG])["occurrences"] == 3  # type: ignore[index]
    triages = [r for r in stack.get(f"/v1/cases/{bug['id']}")["triage_runs"] if r["step"] == "triage"]
    assert len(triages) == 1, "a known failure starts no second triage"

    # 6. A person follows along from a terminal.
    cases = ci_cli(project, env, "cases", "--json")
    assert cases.returncode == 0, cases.stderr
    verdicts = {c["id"]: c["verdict"] for c in json.loads(cases.stdout)}
    assert verdicts[flaky["id"]] == "flaky" and verdicts[bug["id"]] == "deterministic"
    assert verdicts[victim["id"]] == "order_dependent" and verdicts[run_case] is None
    table = ci_cli(project, env, "cases", "--verdict", "order_dependent")
    assert table.returncode == 0, table.stderr
    assert "order_dependent" in table.stdout and "test_report_uses_release_mode" in table.stdout
    shown = ci_cli(project, env, "cases", "show", str(victim["id"]))
    assert shown.returncode == 0 and POLLUTER in shown.stdout, shown.stdout + shown.stderr

    # 7. The next CI run sees the quarantine: the flaky test (failing again) and the victim are
    # reported as quarantined, and only the real bug fails the session.
    flipper.fail_next()
    again = ci_pytest(project, env)
    assert again.returncode == 1, again.stdout + again.stderr
    assert re.search(r"1 failed, 2 passed, 2 quarantined", again.stdout), again.stdout
    assert f"FAILED {DATA_BUG}" in again.stdout
    assert f"flaketriage: QUARANTINED {FLAKY} - flaky" in again.stdout
    assert f"flaketriage: QUARANTINED {VICTIM} - order_dependent" in again.stdout
    assert "flaketriage: warning" not in again.stdout + again.stderr  # the service's list, not a cache
    flipper_integration.fail_next()
    step = ci_pytest(project, env, "integration")
    assert step.returncode == 0, step.stdout + step.stderr
    assert f"flaketriage: QUARANTINED {INTEGRATION} - flaky" in step.stdout, step.stdout

    # 8. And the configuration is still clean at the end of the day.
    doctor = ci_cli(project, env, "doctor")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "problem" not in doctor.stdout
    assert re.search(r"ok\s+quarantine", doctor.stdout), doctor.stdout


PRODUCTION_SET_UP = Path(__file__).parents[3] / "docs" / "service" / "deploy.md"


def production_setup() -> str:
    """The manual's "Production set-up" page, the whole of it."""
    text = PRODUCTION_SET_UP.read_text(encoding="utf-8")
    assert text.startswith("# Production set-up\n"), PRODUCTION_SET_UP
    return text


def test_the_production_set_up_names_only_real_settings_and_commands() -> None:
    from flaketriage.settings import Settings, env_var

    section = production_setup()
    named = set(re.findall(r"\bFLAKETRIAGE_[A-Z0-9_]+", section))
    assert named - {env_var(field) for field in Settings.model_fields} == set()
    # The day above runs with the settings the section tells CI and the service to set.
    assert {"FLAKETRIAGE_STORE", "FLAKETRIAGE_ALLOWED_STORES", "FLAKETRIAGE_QUARANTINE_URL"} <= named
    commands = set(re.findall(r"`flaketriage ([a-z]+)", section)) | set(
        re.findall(r"^\s*flaketriage ([a-z]+)", section, re.MULTILINE)
    )
    assert commands >= {"serve", "worker", "beat", "doctor", "cases"}, commands
    for command in sorted(commands):
        done = subprocess.run(
            [sys.executable, "-m", "flaketriage", command, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, f"flaketriage {command}: {done.stderr}"
    for flag in re.findall(r"flaketriage worker (--queues \S+)", section):
        assert set(flag.split()[1].split(",")) <= {"cpu", "gpu", "report"}, flag
