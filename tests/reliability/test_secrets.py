"""Secrets planted everywhere a CI job leaks them are masked in everything flaketriage keeps and
shows: every object and file of the store, the triage report, ``bundle show`` and ``bundle
export``, and the receiver's answers about the case. Ordinary hex (the commit, a sha256, the
bundle id) is kept.

One corpus (`corpus.FORMATS`, drawn with a fixed seed) planted by `planted.plant_and_capture`:
the real CLI, in a real git repository. ``bench/reliability.py`` repeats it with fresh draws.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from flaketriage.bundle.io import load_manifest
from flaketriage.events import FailureEvent, StoreLocation
from flaketriage.orchestrator.app import create_app
from flaketriage.orchestrator.service import Service
from flaketriage.records import Database
from flaketriage.settings import load_settings
from flaketriage.signing import signed_headers
from flaketriage.store import open_store
from flaketriage.work.dispatch import MemorySender
from tests.reliability.corpus import FORMATS, Secret, secrets
from tests.reliability.planted import PlantedRun, plant_and_capture, stored_texts

SEED = 23
EVENTS_SECRET = b"events-secret"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> PlantedRun:
    """The corpus planted under secret names and innocuous ones, captured and triaged."""
    return plant_and_capture(tmp_path_factory.mktemp("planted") / "project", secrets(random.Random(SEED)))


@pytest.fixture(scope="module")
def shape_only(tmp_path_factory: pytest.TempPathFactory) -> PlantedRun:
    """The corpus's shaped secrets with no name to give them away: no secret variable, no secret
    configuration key. Captured only."""
    shaped = [s for s in secrets(random.Random(SEED + 1)) if s.shaped]
    project = tmp_path_factory.mktemp("shape-only") / "project"
    return plant_and_capture(project, shaped, by_name=False, triage=False)


@pytest.fixture(scope="module")
def answers(run: PlantedRun, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[tuple[str, str]]]:
    """The receiver's answers about the run's bundle, sent as `flaketriage notify` sends it: the
    event, the case list, the case; and the database file the receiver wrote."""
    path = tmp_path_factory.mktemp("receiver") / "service.db"
    database = Database(f"sqlite:///{path}")
    database.upgrade()
    settings = load_settings(
        store=str(run.store), webhook_secret=EVENTS_SECRET.decode(), allowed_stores=[str(run.store)]
    )
    manifest = load_manifest(open_store(run.store, readonly=True), run.bundle)
    body = FailureEvent.for_manifest(manifest, StoreLocation.parse(run.store)).body()
    with TestClient(create_app(Service.assemble(settings, database, MemorySender()))) as client:
        posted = client.post("/v1/events", content=body, headers=signed_headers(EVENTS_SECRET, body))
        assert posted.status_code == 202, posted.text
        listed = client.get("/v1/cases")
        assert listed.status_code == 200 and len(listed.json()) == 1, listed.text
        case = client.get(f"/v1/cases/{listed.json()[0]['id']}")
        assert case.status_code == 200, case.text
        found = [
            ("POST /v1/events", posted.text),
            ("GET /v1/cases", listed.text),
            ("GET /v1/cases/1", case.text),
        ]
    database.dispose()
    yield [*found, ("the receiver's database file", path.read_bytes().decode("utf-8", "replace"))]


def _leaks(secrets: tuple[Secret, ...], texts: list[tuple[str, str]]) -> list[str]:
    return [
        f"{secret.kind}: {window!r} in {where}"
        for secret in secrets
        for where, text in texts
        if (window := secret.leaks(text)) is not None
    ]


def test_the_corpus_holds_at_least_25_formats() -> None:
    drawn = secrets(random.Random(SEED))
    assert len(FORMATS) >= 25
    assert len({s.kind for s in drawn}) == len(drawn)
    assert secrets(random.Random(SEED)) == drawn  # the short form is the same every run


def test_no_planted_secret_is_in_any_stored_object_or_file(run: PlantedRun) -> None:
    texts = list(stored_texts(run.store))
    assert len(texts) > 10  # the manifest, the logs, the diff, the source files, the refs
    assert _leaks(run.secrets, texts) == []


def test_no_planted_secret_is_in_the_report_or_an_export(run: PlantedRun) -> None:
    assert run.bundle[:12] in run.report
    assert _leaks(run.secrets, [("the report, bundle show or export", run.report)]) == []


def test_no_planted_secret_is_in_any_api_answer(run: PlantedRun, answers: list[tuple[str, str]]) -> None:
    assert run.bundle in answers[2][1]
    assert _leaks(run.secrets, answers) == []


def test_a_secret_of_a_known_shape_is_masked_with_no_name_to_go_by(shape_only: PlantedRun) -> None:
    assert _leaks(shape_only.secrets, list(stored_texts(shape_only.store))) == []


def test_ordinary_hex_is_kept(run: PlantedRun, answers: list[tuple[str, str]]) -> None:
    """Masking a commit or a digest would hide what a replay needs and what a person searches for."""
    store = open_store(run.store, readonly=True)
    manifest = load_manifest(store, run.bundle)
    assert manifest.source is not None and manifest.source.commit == run.commit
    stdout = store.get_bytes(manifest.logs["stdout"].sha256).decode()
    assert f"sha256 of the data: {run.digest}" in stdout
    assert f"built from commit {run.commit}" in stdout
    assert run.bundle in answers[2][1] and manifest.failure.fingerprint in answers[2][1]


def test_a_credential_file_is_never_stored(run: PlantedRun) -> None:
    manifest = load_manifest(open_store(run.store, readonly=True), run.bundle)
    assert manifest.source is not None
    assert ".env" not in {Path(f.path).name for f in manifest.source.files}
    assert "deploy.env" in {f.path for f in manifest.source.files}
