"""One failure is one case across sources: a test the pytest plugin captured, a Sentry alert with the
same exception through the same frames, and a captured program, whichever comes first; and cases
recorded before identities (migration 0004) are joined by the new events of their failure.

(A captured program and a Sentry event of it are one case: `test_sentry.py`'s
``test_an_alert_for_the_captured_exception_lands_on_the_bundles_case`` and the real SDK's.)
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy import select, text

from flaketriage.bundle.io import list_bundles, load_manifest
from flaketriage.bundle.manifest import Manifest
from flaketriage.events import FailureEvent, StoreLocation
from flaketriage.failure.fingerprint import fingerprint_exception
from flaketriage.orchestrator.service import Service
from flaketriage.records import Base, Case, Database
from flaketriage.records.database import MIGRATIONS
from flaketriage.settings import load_settings
from flaketriage.store import open_store
from flaketriage.work.dispatch import MemorySender
from tests.conftest import new_postgres_database
from tests.orchestrator.conftest import EVENTS_SECRET, SENTRY_SECRET, MakeReceiver, Receiver

Load = Callable[[str], dict[str, Any]]

TRAINER_PY = 'def load(batch):\n    raise ValueError(f"bad batch {batch}")\n'
TEST_TRAINER_PY = "from trainer import load\n\n\ndef test_load():\n    load(7)\n"
_CI_VARS = ("CI", "GITHUB_ACTIONS", "GITLAB_CI", "BUILDKITE", "JENKINS_URL", "CIRCLECI", "BUILD_NUMBER")


@dataclass(frozen=True)
class PluginBundle:
    """A project whose test ``test_trainer.py::test_load`` failed under the plugin: ValueError('bad
    batch 7') raised in trainer.load(), called by the test."""

    project: Path
    bundle_id: str

    @property
    def store(self) -> Path:
        return self.project / ".flaketriage"

    @property
    def manifest(self) -> Manifest:
        return load_manifest(open_store(self.store, readonly=True), self.bundle_id)

    def event(self, **update: Any) -> FailureEvent:
        event = FailureEvent.for_manifest(self.manifest, StoreLocation.parse(self.store))
        return event.model_copy(update=update) if update else event


@pytest.fixture(scope="module")
def test_bundle(tmp_path_factory: pytest.TempPathFactory) -> PluginBundle:
    project = tmp_path_factory.mktemp("tests_project")
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / "trainer.py").write_text(TRAINER_PY)
    (project / "test_trainer.py").write_text(TEST_TRAINER_PY)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLAKETRIAGE_") and k not in _CI_VARS}
    env |= {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "flaketriage", "--flaketriage", "-p", "no:cacheprovider"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 1 and "captured 1 failure" in done.stdout, done.stdout + done.stderr
    [bundle] = list_bundles(open_store(project / ".flaketriage", readonly=True))
    return PluginBundle(project, bundle.id)


@pytest.fixture
def receiver_for(make_receiver: MakeReceiver, test_bundle: PluginBundle) -> Receiver:
    return make_receiver(store=str(test_bundle.store), allowed_stores=[str(test_bundle.store)])


def _alert(load_payload: Load, root: str = "/srv/app") -> dict[str, Any]:
    """The recorded issue alert, its exception the test's: ValueError('bad batch 7') in load(),
    called by test_load(), the files under `root` (deployed elsewhere than the CI's checkout)."""
    data = load_payload("sentry_event_alert.triggered.json")
    exception = data["data"]["event"]["exception"]["values"][-1]
    recorded = exception["stacktrace"]["frames"]
    frames = []
    for name, function, line in [("test_trainer.py", "test_load", 5), ("trainer.py", "load", 2)]:
        frame = copy.deepcopy(recorded[-1])
        frame |= {"filename": name, "abs_path": f"{root}/{name}", "function": function, "lineno": line}
        frame |= {"module": name.removesuffix(".py"), "vars": {}}
        frames.append(frame)
    exception["stacktrace"]["frames"] = frames
    return data


# -- the identity the plugin writes ---------------------------------------------------------------
def test_the_plugins_bundle_has_the_identity_of_its_exception_and_keeps_its_fingerprint(
    test_bundle: PluginBundle,
) -> None:
    failure = test_bundle.manifest.failure
    root = str(test_bundle.project)
    frames = [(f"{root}/test_trainer.py", "test_load"), (f"{root}/trainer.py", "load")]

    assert failure.identity == fingerprint_exception("ValueError", "bad batch 7", frames, [root]).fingerprint
    assert failure.signature.startswith("pytest|test_trainer.py::test_load|ValueError|")
    assert failure.case_identity == failure.identity != failure.fingerprint
    assert test_bundle.event().identity == failure.identity


# -- one case across sources ----------------------------------------------------------------------
def test_a_sentry_alert_of_the_tests_exception_lands_on_the_tests_case(
    receiver_for: Receiver, test_bundle: PluginBundle, load_payload: Load
) -> None:
    assert receiver_for.post_event(test_bundle.event()).status_code == 202
    [case] = receiver_for.cases()

    response = receiver_for.sentry("event_alert", _alert(load_payload))

    assert response.status_code == 200, response.text
    assert response.json()["cases"] == [case.id]
    [case] = receiver_for.cases()
    assert (case.kind, case.occurrences) == ("bundle", 2)
    assert case.fingerprint == test_bundle.manifest.failure.fingerprint
    assert case.identity == test_bundle.manifest.failure.identity
    assert [o.source for o in receiver_for.occurrences()] == ["events", "sentry"]
    assert len(receiver_for.works()) == 1


def test_the_tests_bundle_joins_and_triages_the_case_a_sentry_alert_opened(
    receiver_for: Receiver, test_bundle: PluginBundle, load_payload: Load
) -> None:
    assert receiver_for.sentry("event_alert", _alert(load_payload)).status_code == 200
    [case] = receiver_for.cases()
    assert (case.kind, case.status) == ("sentry", "open")

    response = receiver_for.post_event(test_bundle.event())

    assert response.status_code == 202, response.text
    assert response.json()["cases"] == [case.id]
    [case] = receiver_for.cases()
    assert (case.status, case.occurrences) == ("queued", 2)
    [work] = receiver_for.works()
    assert work.bundle_id == test_bundle.bundle_id


def test_another_code_path_of_the_same_exception_is_another_case(
    receiver_for: Receiver, test_bundle: PluginBundle, load_payload: Load
) -> None:
    receiver_for.post_event(test_bundle.event())
    data = _alert(load_payload)
    data["data"]["event"]["exception"]["values"][-1]["stacktrace"]["frames"][0]["function"] = "test_other"

    assert receiver_for.sentry("event_alert", data).status_code == 200

    assert len(receiver_for.cases()) == 2


def test_an_event_without_an_identity_is_keyed_by_its_fingerprint_as_before(
    receiver_for: Receiver, test_bundle: PluginBundle, load_payload: Load
) -> None:
    """What an earlier plugin sent: the body has no identity; its case is its fingerprint's."""
    old = test_bundle.event(identity=None)
    assert b'"identity"' not in old.body()

    assert receiver_for.post_event(old).status_code == 202
    [case] = receiver_for.cases()
    assert case.identity == case.fingerprint == old.fingerprint
    # The new plugin's event of the same failure: the case adopts the identity, and Sentry finds it.
    assert receiver_for.post_event(test_bundle.event()).json()["cases"] == [case.id]
    assert receiver_for.sentry("event_alert", _alert(load_payload)).json()["cases"] == [case.id]
    [case] = receiver_for.cases()
    assert (case.occurrences, case.identity) == (3, test_bundle.manifest.failure.identity)


def test_both_events_of_one_failure_in_one_batch_are_one_case(
    receiver_for: Receiver, test_bundle: PluginBundle
) -> None:
    intake = receiver_for.service.intake
    from flaketriage.orchestrator.sightings import StorePolicy, from_event

    policy = StorePolicy([str(test_bundle.store)])
    new, old = test_bundle.event(), test_bundle.event(identity=None)
    results = intake.record_batch(
        [
            ("events", old.event_id, "failure.captured", [from_event(old, policy)]),
            ("events", new.event_id, "failure.captured", [from_event(new, policy)]),
        ]
    )

    [case] = receiver_for.cases()
    assert [r.cases for r in results] == [(case.id,), (case.id,)]
    assert (case.occurrences, case.identity) == (2, new.identity)


@pytest.mark.parametrize(
    "identity", ["../../etc/passwd", "A" * 64, "f" * 65, "", 7, "0" * 63 + "\x00"], ids=repr
)
def test_a_hostile_identity_is_a_422_that_records_nothing(
    receiver_for: Receiver, test_bundle: PluginBundle, identity: object
) -> None:
    body = json.loads(test_bundle.event().body())
    body["identity"] = identity

    response = receiver_for.post_event(json.dumps(body).encode())

    assert response.status_code == 422, response.text
    assert "identity" in response.text
    assert receiver_for.cases() == [] and receiver_for.deliveries() == []


# -- cases recorded before identities -------------------------------------------------------------
def _receiver(database: Database, store: Path) -> Receiver:
    settings = load_settings(
        store=str(store),
        webhook_secret=EVENTS_SECRET.decode(),
        sentry_client_secret=SENTRY_SECRET.decode(),
        allowed_stores=[str(store)],
    )
    sender = MemorySender()
    return Receiver(Service.assemble(settings, database, sender), sender)


def _upgrade(database: Database, revision: str) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with database.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, revision)


@pytest.fixture(params=["sqlite", "postgresql"])
def fresh_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    """A database of its own, with no schema yet."""
    if request.param == "sqlite":
        database = Database(f"sqlite:///{tmp_path / 'old.db'}")
        yield database
        database.dispose()
        return
    with new_postgres_database("ft_identity") as url:
        database = Database(url)
        try:
            yield database
        finally:
            database.dispose()


def test_a_case_recorded_before_identities_gets_its_fingerprint_and_joins_the_new_events(
    fresh_database: Database, test_bundle: PluginBundle, load_payload: Load
) -> None:
    _upgrade(fresh_database, "0003")
    fingerprint = test_bundle.manifest.failure.fingerprint
    now = datetime(2026, 12, 1, tzinfo=UTC)
    with fresh_database.engine.begin() as conn:  # the case an earlier service recorded for the test
        conn.execute(
            text(
                "INSERT INTO cases (fingerprint, kind, title, test_id, status, first_seen, last_seen,"
                " occurrences, generation) VALUES (:f, 'bundle', 'test_load: ValueError',"
                " 'test_trainer.py::test_load', 'reported', :now, :now, 1, 1)"
            ),
            {"f": fingerprint, "now": now},
        )
        conn.execute(
            text(
                "INSERT INTO cases (fingerprint, kind, title, status, first_seen, last_seen,"
                " occurrences, generation) VALUES ('other', 'workflow', 't', 'open', :now, :now, 1, 0)"
            ),
            {"now": now},
        )

    fresh_database.upgrade()

    with fresh_database.engine.connect() as conn:  # the migration builds what the model describes
        differences = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert [d for d in differences if "identity" in repr(d)] == []
    with fresh_database.session() as session:
        assert session.execute(select(Case.fingerprint, Case.identity).order_by(Case.id)).all() == [
            (fingerprint, fingerprint),
            ("other", "other"),
        ]
    receiver = _receiver(fresh_database, test_bundle.store)
    try:
        [old_case, _] = receiver.cases()

        assert receiver.post_event(test_bundle.event()).json()["cases"] == [old_case.id]
        assert receiver.sentry("event_alert", _alert(load_payload)).json()["cases"] == [old_case.id]

        [case, _] = receiver.cases()
        assert (case.id, case.occurrences, case.fingerprint) == (old_case.id, 3, fingerprint)
        assert case.identity == test_bundle.manifest.failure.identity
    finally:
        receiver.client.close()
