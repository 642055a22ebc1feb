"""Sending events to a real HTTP receiver: signatures, retries, the outbox, and the CLI."""

from __future__ import annotations

import json
import os
import random
import stat
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from flaketriage.bundle.io import load_manifest
from flaketriage.bundle.manifest import Provenance
from flaketriage.ci import notify
from flaketriage.ci.notify import (
    EVENT_REF,
    Notifier,
    _retry_after,
    backoff_delay,
    event_for_bundle,
    is_retryable,
    merge_provenance,
    send_bundles,
    send_event,
    send_or_queue,
    unsent_bundles,
)
from flaketriage.ci.outbox import Outbox
from flaketriage.errors import EventRefusedError, NotifyError
from flaketriage.events import FailureEvent, StoreLocation
from flaketriage.files.modes import FileModes

if TYPE_CHECKING:
    from conftest import Project, Receiver  # tests/ci/conftest.py

pytestmark = pytest.mark.usefixtures("clean_env")


def _event(project: Project, index: int = 0) -> FailureEvent:
    return event_for_bundle(project.store, project.bundles[index])


# -- send_event ---------------------------------------------------------------------------------
def test_happy_path_is_signed_and_received(project: Project, receiver: Receiver) -> None:
    event = _event(project)
    send_event(receiver.url, event, receiver.secret)
    assert receiver.events == [event]
    (request,) = receiver.requests
    assert request["headers"]["Content-Type"] == "application/json"
    assert request["headers"]["User-Agent"].startswith("flaketriage/")
    assert request["body"] == event.body()
    manifest = load_manifest(project.store, project.bundles[0])
    assert event.fingerprint == manifest.failure.fingerprint
    assert event.failure.kind == "exit"
    assert event.store == StoreLocation(kind="local", location=str(project.store.root))


def test_503_twice_then_200_is_retried(project: Project, receiver: Receiver, fast_backoff: list[int]) -> None:
    receiver.script = [(503, {}), (503, {})]
    event = _event(project)
    send_event(receiver.url, event, receiver.secret)
    assert receiver.events == [event]
    assert len(receiver.requests) == 3 and fast_backoff == [0, 1]
    assert {r["body"] for r in receiver.requests} == {event.body()}  # one event id across attempts


def test_429_waits_as_long_as_retry_after_says(project: Project, receiver: Receiver) -> None:
    receiver.script = [(429, {"Retry-After": "1"})]
    start = time.monotonic()
    send_event(receiver.url, _event(project), receiver.secret, backoff_s=0.01)
    assert time.monotonic() - start >= 1.0
    assert len(receiver.requests) == 2 and len(receiver.events) == 1


def test_a_retry_after_longer_than_a_job_should_wait_gives_up(project: Project, receiver: Receiver) -> None:
    receiver.script = [(503, {"Retry-After": "3600"})]
    start = time.monotonic()
    with pytest.raises(NotifyError, match="503") as info:
        send_event(receiver.url, _event(project), receiver.secret)
    assert time.monotonic() - start < 5
    assert info.value.status == 503 and not info.value.event_rejected
    assert len(receiver.requests) == 1


def test_400_is_not_retried(project: Project, receiver: Receiver, fast_backoff: list[int]) -> None:
    receiver.script = [(400, {})]
    with pytest.raises(EventRefusedError, match="HTTP 400") as info:
        send_event(receiver.url, _event(project), receiver.secret)
    assert info.value.event_rejected
    assert len(receiver.requests) == 1 and fast_backoff == []


@pytest.mark.parametrize(
    ("status", "body", "setting"),
    [
        (401, "the signature does not match the body", "FLAKETRIAGE_WEBHOOK_SECRET"),
        (401, "events are refused: FLAKETRIAGE_WEBHOOK_SECRET is not set", "FLAKETRIAGE_WEBHOOK_SECRET"),
        (401, "the request was signed 900 s ago: the sender's clock is behind", None),
        (403, "", "FLAKETRIAGE_WEBHOOK_SECRET"),
        (404, '{"detail":"Not Found"}', "FLAKETRIAGE_NOTIFY_URL"),
        (405, "", "FLAKETRIAGE_NOTIFY_URL"),
        (
            422,
            '{"detail":"store \'/ci/.flaketriage\' is not one this service reads; allowed: file:///srv '
            '(FLAKETRIAGE_ALLOWED_STORES)"}',
            "FLAKETRIAGE_STORE",
        ),
        (422, '{"detail":"failure.kind: Input should be \'exit\'"}', None),
        (413, "", "FLAKETRIAGE_MAX_BODY_KB"),
        (410, "", "FLAKETRIAGE_NOTIFY_URL"),
        (418, "", None),
    ],
)
def test_a_refusal_retrying_cannot_fix_names_the_setting_at_once(
    project: Project, receiver: Receiver, fast_backoff: list[int], status: int, body: str, setting: str | None
) -> None:
    receiver.script = [(status, {}, body)]
    with pytest.raises(EventRefusedError) as info:
        send_event(receiver.url, _event(project), receiver.secret)
    assert info.value.status == status and info.value.setting == setting
    assert len(receiver.requests) == 1 and fast_backoff == []
    assert "newer service" not in str(info.value)
    if setting is not None:
        assert setting in str(info.value)


@pytest.mark.parametrize("status", [500, 502, 503, 504, 408, 425, 429])
def test_what_may_pass_later_is_retried(
    project: Project, receiver: Receiver, fast_backoff: list[int], status: int
) -> None:
    assert is_retryable(status)
    receiver.script = [(status, {}, "")] * 3
    with pytest.raises(NotifyError) as info:
        send_event(receiver.url, _event(project), receiver.secret, retries=2)
    assert not isinstance(info.value, EventRefusedError) and info.value.status == status
    assert len(receiver.requests) == 3


def test_a_wrong_secret_is_refused_and_not_retried(
    project: Project, receiver: Receiver, fast_backoff: list[int]
) -> None:
    with pytest.raises(EventRefusedError, match=r"HTTP 401.*FLAKETRIAGE_WEBHOOK_SECRET") as info:
        send_event(receiver.url, _event(project), b"not-the-secret")
    assert info.value.status == 401 and not info.value.event_rejected
    assert info.value.setting == "FLAKETRIAGE_WEBHOOK_SECRET"
    assert len(receiver.requests) == 1 and receiver.events == []


def test_retries_run_out(project: Project, receiver: Receiver, fast_backoff: list[int]) -> None:
    receiver.script = [(502, {})] * 10
    with pytest.raises(NotifyError, match="3 attempt"):
        send_event(receiver.url, _event(project), receiver.secret, retries=2)
    assert len(receiver.requests) == 3


def test_connection_refused_is_retried_then_raised(
    project: Project, dead_url: str, fast_backoff: list[int]
) -> None:
    with pytest.raises(NotifyError, match="could not reach") as info:
        send_event(dead_url, _event(project), project.secret, retries=3)
    assert info.value.status is None and fast_backoff == [0, 1, 2]


def test_a_url_that_is_not_http_is_not_retried(project: Project, fast_backoff: list[int]) -> None:
    with pytest.raises(EventRefusedError, match="FLAKETRIAGE_NOTIFY_URL") as info:
        send_event("ftp://example.invalid/v1/events", _event(project), project.secret)
    assert fast_backoff == [] and info.value.setting == "FLAKETRIAGE_NOTIFY_URL"


def test_backoff_grows_with_jitter_and_is_capped() -> None:
    rng = random.Random(0)
    for attempt, full in [(0, 0.5), (1, 1.0), (3, 4.0), (20, notify.MAX_DELAY_S)]:
        delays = [backoff_delay(attempt, 0.5, rng) for _ in range(200)]
        assert all(full / 2 <= d <= full for d in delays)
        assert len(set(delays)) > 100


def test_retry_after_reads_seconds_and_dates() -> None:
    now = datetime(2025, 1, 1, tzinfo=UTC)
    assert _retry_after("7") == 7.0
    later = format_datetime(now + timedelta(seconds=90), usegmt=True)
    assert _retry_after(later, now=now.timestamp()) == pytest.approx(90)
    assert _retry_after(format_datetime(now - timedelta(days=1), usegmt=True), now=now.timestamp()) == 0
    assert _retry_after("soon") is None and _retry_after(None) is None and _retry_after("") is None


# -- send_or_queue (what the pytest plugin calls) -------------------------------------------------
def test_send_or_queue_sends_and_a_resend_is_a_duplicate(project: Project, receiver: Receiver) -> None:
    bundle = project.bundles[0]
    assert send_or_queue(project.settings(receiver.url), project.store, bundle) == "sent"
    assert [e.bundle_id for e in receiver.events] == [bundle]
    assert project.store.get_ref(EVENT_REF + bundle) == receiver.events[0].body()
    # The same bundle again: the same event id, which the receiver drops.
    assert send_or_queue(project.settings(receiver.url), project.store, bundle) == "sent"
    assert len(receiver.requests) == 2 and len(receiver.events) == 1
    assert project.outbox.pending() == []


def test_off_without_a_url(project: Project) -> None:
    assert send_or_queue(project.settings(None), project.store, project.bundles[0]) == "off"
    assert send_or_queue(project.settings(""), project.store, project.bundles[0]) == "off"
    assert not project.outbox.directory.exists()


def test_service_down_queues_and_the_next_run_flushes_oldest_first(
    project: Project, receiver: Receiver, dead_url: str, fast_backoff: list[int]
) -> None:
    first, second = project.bundles
    assert send_or_queue(project.settings(dead_url), project.store, first) == "queued"
    (queued,) = project.outbox.pending()
    assert queued.bundle_id == first
    assert project.outbox.path_of(queued.event_id).is_file()

    project.outbox.release()  # the pause after a failure has passed
    assert send_or_queue(project.settings(receiver.url), project.store, second) == "sent"
    assert [e.bundle_id for e in receiver.events] == [first, second]
    assert receiver.events[0].event_id == queued.event_id
    assert project.outbox.pending() == []


def test_after_a_failure_automatic_sends_queue_without_waiting(
    project: Project, receiver: Receiver, dead_url: str, fast_backoff: list[int]
) -> None:
    first, second = project.bundles
    assert send_or_queue(project.settings(dead_url), project.store, first) == "queued"
    assert project.outbox.held()
    tries = len(fast_backoff)
    assert send_or_queue(project.settings(receiver.url), project.store, second) == "queued"
    assert receiver.requests == [] and len(fast_backoff) == tries
    assert len(project.outbox.pending()) == 2
    # An explicit flush does not wait for the pause.
    result = Notifier.from_settings(project.settings(receiver.url)).flush()
    assert len(result.sent) == 2 and not project.outbox.held()
    assert [e.bundle_id for e in receiver.events] == [first, second]


def test_no_secret_is_refused_without_sending_or_queueing(project: Project, receiver: Receiver) -> None:
    settings = project.settings(receiver.url, secret=b"")
    sending = send_bundles(settings, project.store, project.bundles)
    assert sending is not None
    assert [d.status for d in sending.deliveries] == ["refused", "refused"]
    assert receiver.requests == [] and project.outbox.pending() == []
    (line,) = sending.error_lines()
    assert line.startswith("2 event(s) not sent") and "set FLAKETRIAGE_WEBHOOK_SECRET" in line


def test_a_store_the_service_does_not_read_is_refused_not_queued_nor_remembered(
    project: Project, receiver: Receiver
) -> None:
    detail = "store '/x' is not one this service reads; allowed: file:///srv (FLAKETRIAGE_ALLOWED_STORES)"
    receiver.script = [(422, {}, json.dumps({"detail": detail}))] * 2
    sending = send_bundles(project.settings(receiver.url), project.store, project.bundles)
    assert sending is not None
    assert [(d.status, d.setting) for d in sending.deliveries] == [("refused", "FLAKETRIAGE_STORE")] * 2
    assert len(receiver.requests) == 2  # an event's refusal: the next one is still tried
    assert project.outbox.pending() == [] and not project.outbox.held()
    assert unsent_bundles(project.store) == project.bundles  # `notify --new` sends them when fixed
    (line,) = sending.error_lines()
    assert "FLAKETRIAGE_STORE" in line and detail in line
    assert send_or_queue(project.settings(receiver.url), project.store, project.bundles[0]) == "sent"


def test_a_wrong_url_refuses_the_rest_without_sending_them(
    project: Project, receiver: Receiver, fast_backoff: list[int]
) -> None:
    receiver.script = [(404, {})]
    sending = send_bundles(project.settings(receiver.url), project.store, project.bundles)
    assert sending is not None and len(receiver.requests) == 1
    assert {d.setting for d in sending.deliveries} == {"FLAKETRIAGE_NOTIFY_URL"}
    assert project.outbox.pending() == []
    (line,) = sending.error_lines()
    assert line.startswith("2 event(s) not sent")


# -- the outbox ---------------------------------------------------------------------------------
def test_outbox_put_is_atomic_and_idempotent(project: Project) -> None:
    outbox = project.outbox
    event = _event(project)
    path = outbox.put(event)
    assert outbox.put(event) == path == outbox.directory / f"{event.event_id}.json"
    assert path.read_bytes() == event.body()
    assert sorted(p.name for p in outbox.directory.iterdir()) == [path.name]
    assert outbox.pending() == [event]


@pytest.mark.parametrize(("shared", "file_mode", "dir_mode"), [(False, 0o600, 0o700), (True, 0o640, 0o2770)])
def test_the_outbox_has_the_stores_modes_whatever_the_umask(
    project: Project, tmp_path: Path, shared: bool, file_mode: int, dir_mode: int
) -> None:
    # An event quotes the failure (message, command, paths): it is no more public than the store.
    outbox = Outbox(tmp_path / "outbox", modes=FileModes.of(shared))
    old = os.umask(0o022)
    try:
        path = outbox.put(_event(project))
        outbox.hold(60)
    finally:
        os.umask(old)
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in outbox.directory.iterdir()} == {
        path.name: file_mode,
        ".hold-until": file_mode,
    }
    assert stat.S_IMODE(outbox.directory.stat().st_mode) == dir_mode


def test_outbox_flush_goes_on_past_a_rejected_event_and_stops_when_unreachable(project: Project) -> None:
    outbox = project.outbox
    old = _event(project, 0).model_copy(update={"created_at": datetime(2024, 1, 1, tzinfo=UTC)})
    new = _event(project, 1)
    outbox.put(new)
    outbox.put(old)
    assert outbox.pending() == [old, new]

    sent: list[str] = []

    def reject_old(event: FailureEvent) -> None:
        if event == old:
            raise EventRefusedError("HTTP 422", status=422)
        sent.append(event.event_id)

    result = outbox.flush(reject_old)
    assert result.sent == [new.event_id] == sent
    assert [r.event for r in result.refused] == [old] and result.kept == [] and not result.unreachable
    assert outbox.pending() == []  # refused for good: not kept for ever

    outbox.put(old)
    outbox.put(new)

    def down(event: FailureEvent) -> None:
        raise NotifyError("connection refused")

    result = outbox.flush(down)
    assert result.unreachable and result.sent == []
    assert result.kept == [old.event_id, new.event_id] and list(result.errors) == [old.event_id]
    assert outbox.pending() == [old, new]


def test_outbox_flush_drops_everything_once_the_setup_is_refused(project: Project) -> None:
    outbox = project.outbox
    events = [_event(project, 0), _event(project, 1)]
    for event in events:
        outbox.put(event)
    tried: list[str] = []

    def wrong_secret(event: FailureEvent) -> None:
        tried.append(event.event_id)
        raise EventRefusedError("HTTP 401", status=401, setting="FLAKETRIAGE_WEBHOOK_SECRET")

    result = outbox.flush(wrong_secret)
    assert len(tried) == 1 and {r.event.event_id for r in result.refused} == {e.event_id for e in events}
    assert {r.setting for r in result.refused} == {"FLAKETRIAGE_WEBHOOK_SECRET"}
    assert outbox.pending() == [] and result.to_json()["refused"].keys() == {e.event_id for e in events}


def test_outbox_leaves_unreadable_files_alone(project: Project) -> None:
    outbox = project.outbox
    outbox.directory.mkdir(parents=True)
    junk = outbox.directory / "junk.json"
    junk.write_text("{not json")
    result = outbox.flush(lambda event: None)
    assert result.unreadable == [junk] and junk.exists()


# -- provenance ---------------------------------------------------------------------------------
def test_the_sending_ci_run_fills_in_a_capture_without_one(project: Project) -> None:
    github = {
        "GITHUB_ACTIONS": "true",
        "GITHUB_REPOSITORY": "acme/models",
        "GITHUB_RUN_ID": "42",
        "GITHUB_JOB": "train",
        "GITHUB_RUN_ATTEMPT": "2",
        "RUNNER_NAME": "gpu-runner-3",
    }
    event = event_for_bundle(project.store, project.bundles[0], env=github)
    assert event.provenance.ci_provider == "github-actions"
    assert event.provenance.run_url == "https://github.com/acme/models/actions/runs/42"
    assert (event.provenance.job, event.provenance.attempt, event.provenance.runner) == (
        "train",
        "2",
        "gpu-runner-3",
    )
    recorded = Provenance(ci_provider="gitlab-ci", job="unit")
    assert merge_provenance(recorded, event.provenance) == recorded


def test_a_new_location_makes_a_new_event(project: Project, receiver: Receiver) -> None:
    bundle = project.bundles[0]
    local = event_for_bundle(project.store, bundle)
    notify.remember_event(project.store, local)
    assert event_for_bundle(project.store, bundle) == local
    assert unsent_bundles(project.store) == [project.bundles[1]]
    s3 = StoreLocation.parse("s3://bucket/ft")
    moved = event_for_bundle(project.store, bundle, location=s3)
    assert moved.event_id != local.event_id and moved.store == s3
    assert unsent_bundles(project.store, s3) == project.bundles


# -- the CLI ------------------------------------------------------------------------------------
def _cli(project: Project, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("FLAKETRIAGE_")}
    full.update({"FLAKETRIAGE_WEBHOOK_SECRET": project.secret.decode(), "NO_PROXY": "127.0.0.1,localhost"})
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "flaketriage", "notify", *args],
        cwd=project.root,
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_cli_down_service_warns_exits_0_and_flush_delivers(
    project: Project, receiver: Receiver, dead_url: str
) -> None:
    bundle = project.bundles[0]
    proc = _cli(project, bundle[:10], "--to", dead_url, "--retries", "0", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "warning" in proc.stderr and "queued in" in proc.stderr and "could not reach" in proc.stderr
    (queued,) = project.outbox.pending()
    (delivery,) = json.loads(proc.stdout)["events"]
    assert delivery["status"] == "queued" and delivery["event_id"] == queued.event_id
    assert "[Errno" in delivery["error"]  # printed as is, not taken for markup

    strict = _cli(project, bundle, "--to", dead_url, "--retries", "0", "--strict")
    assert strict.returncode == 1
    assert project.outbox.pending() == [queued]  # the same event, not a second one

    proc = _cli(project, "--flush", "--to", receiver.url, "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["flushed"]["sent"] == [queued.event_id] and result["pending"] == 0
    assert receiver.event_ids() == [queued.event_id] and project.outbox.pending() == []


def test_cli_new_sends_each_bundle_once_with_its_location(project: Project, receiver: Receiver) -> None:
    proc = _cli(
        project,
        "--new",
        "--location",
        "s3://bucket/ft",
        "--json",
        env={"FLAKETRIAGE_NOTIFY_URL": receiver.url},
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert [e["bundle"] for e in result["events"]] == project.bundles
    assert {e["status"] for e in result["events"]} == {"sent"}
    assert [e.bundle_id for e in receiver.events] == project.bundles
    assert {e.store.location for e in receiver.events} == {"s3://bucket/ft"}

    again = _cli(
        project,
        "--new",
        "--location",
        "s3://bucket/ft",
        "--json",
        env={"FLAKETRIAGE_NOTIFY_URL": receiver.url},
    )
    assert json.loads(again.stdout)["events"] == [] and len(receiver.requests) == 2


def test_cli_reads_the_secret_from_the_named_variable(project: Project, receiver: Receiver) -> None:
    proc = _cli(
        project,
        project.bundles[0],
        "--to",
        receiver.url,
        "--secret-env",
        "MY_SECRET",
        env={"FLAKETRIAGE_WEBHOOK_SECRET": "wrong", "MY_SECRET": project.secret.decode()},
    )
    assert proc.returncode == 0 and "sent bundle" in proc.stderr, proc.stderr
    assert len(receiver.events) == 1


def test_cli_usage_errors(project: Project) -> None:
    nothing = _cli(project, "--to", "http://127.0.0.1:9/v1/events")
    assert nothing.returncode == 2 and "nothing to send" in nothing.stderr
    no_url = _cli(project, project.bundles[0])
    assert no_url.returncode == 2 and "FLAKETRIAGE_NOTIFY_URL" in no_url.stderr
    unknown = _cli(project, "beef" * 4, "--to", "http://127.0.0.1:9/v1/events")
    assert unknown.returncode == 2 and "no bundle" in unknown.stderr
