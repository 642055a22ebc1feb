"""``notify --new`` on a store shared between CI machines and the service: it sends the captured
bundles no event was made for, never the service's own minimized bundles, and never a bundle
whose event another machine (its own path to the store) or another flaketriage version sent, so no
failure is counted again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pytest

from flaketriage.bundle.io import list_bundles, load_manifest, write_bundle
from flaketriage.ci import notify
from flaketriage.ci.notify import EVENT_REF, event_for_bundle, unsent_bundles
from flaketriage.events import StoreLocation
from flaketriage.store import LocalStore

if TYPE_CHECKING:
    from conftest import Project, Receiver  # tests/ci/conftest.py

pytestmark = pytest.mark.usefixtures("clean_env")


def _shared_store(project: Project) -> tuple[LocalStore, dict[str, str]]:
    """The project's store, shared, holding: ``sent_elsewhere`` (its event sent by a CI machine that
    mounts the store at another path), ``sent_by_old`` (an event recorded by another flaketriage
    version), ``minimized`` (the service's minimal bundle of the first) and ``unsent``."""
    store = LocalStore(project.store.root, shared=True)
    first, second = project.bundles
    elsewhere = StoreLocation(kind="local", location="/mnt/ci-runner-7/flaketriage")
    notify.remember_event(store, event_for_bundle(store, first, location=elsewhere))
    store.put_ref(EVENT_REF + second, json.dumps({"event": "written by flaketriage 0.1"}).encode())
    parent = load_manifest(store, first)
    minimized = write_bundle(
        store, parent.model_copy(update={"parent": first, "created_at": datetime(2030, 1, 1, tzinfo=UTC)})
    )
    unsent = write_bundle(
        store,
        load_manifest(store, second).model_copy(update={"created_at": datetime(2030, 1, 2, tzinfo=UTC)}),
    )
    return store, {"sent_elsewhere": first, "sent_by_old": second, "minimized": minimized, "unsent": unsent}


def test_unsent_bundles_leave_out_the_service_s_bundles_and_those_sent_from_elsewhere(
    project: Project,
) -> None:
    store, bundles = _shared_store(project)
    assert {b.id for b in list_bundles(store)} == set(bundles.values())

    assert unsent_bundles(store) == [bundles["unsent"]]
    # Asked for one location, a bundle sent for another is sent for it (never a minimized one).
    s3 = StoreLocation.parse("s3://bucket/ft")
    assert unsent_bundles(store, s3) == [bundles["sent_elsewhere"], bundles["sent_by_old"], bundles["unsent"]]


def test_cli_new_on_a_shared_store_sends_only_what_ci_captured_and_nobody_sent(
    project: Project, receiver: Receiver
) -> None:
    _, bundles = _shared_store(project)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLAKETRIAGE_")}
    env |= {
        "FLAKETRIAGE_WEBHOOK_SECRET": project.secret.decode(),
        "FLAKETRIAGE_NOTIFY_URL": receiver.url,
        "FLAKETRIAGE_STORE_SHARED": "1",
        "NO_PROXY": "127.0.0.1,localhost",
    }
    argv = [sys.executable, "-m", "flaketriage", "notify", "--new", "--json"]

    def run() -> list[str]:
        proc = subprocess.run(
            argv, cwd=project.root, env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert proc.returncode == 0, proc.stderr
        return [e["bundle"] for e in json.loads(proc.stdout)["events"]]

    assert run() == [bundles["unsent"]]
    assert [e.bundle_id for e in receiver.events] == [bundles["unsent"]]
    assert run() == []  # sent once: the next run has nothing to send
    assert len(receiver.events) == 1
