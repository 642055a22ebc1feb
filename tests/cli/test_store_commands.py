"""`bundle push`, `bundle pull` and `gc` through the real CLI, against real captures and a real
S3-compatible server (moto): what they send, what they keep, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from flaketriage.bundle.io import REF_PREFIX, read_manifest, write_bundle
from flaketriage.quarantine import FailureRate, QuarantineDocument, QuarantineEntry, QuarantineEvidence
from flaketriage.settings import load_settings
from flaketriage.store import LocalStore, Store, open_store
from tests.conftest import S3Server, free_port


def _capture(cli, code: str) -> str:  # type: ignore[no-untyped-def]
    proc = cli("capture", "--json", "--", sys.executable, "-c", code)
    assert proc.returncode == 1, proc.stderr
    bundle: str = json.loads(proc.stdout.strip().splitlines()[-1])["bundle"]
    return bundle


def _json(proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert proc.returncode == 0, proc.stderr
    data: dict[str, object] = json.loads(proc.stdout)
    return data


def _one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error:") and proc.stderr.count("\n") == 1, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


def test_push_then_pull_through_s3(cli, tmp_path: Path, s3_url: str, s3_server: S3Server) -> None:  # type: ignore[no-untyped-def]
    env = s3_server.env
    first = _capture(cli, "raise ValueError('first')")
    second = _capture(cli, "raise KeyError('second')")

    pushed = _json(cli("bundle", "push", first, second[:10], "--to", s3_url + "/", "--json", env=env))
    assert sorted(pushed["bundles"]) == sorted([first, second])  # type: ignore[type-var]
    assert pushed["objects_sent"] and pushed["bytes_sent"] and pushed["objects_present"] == 0
    assert pushed["to"] == f"{s3_url} (at {s3_server.endpoint})"
    again = _json(cli("bundle", "push", first, second, "--to", s3_url, "--json", env=env))
    assert (again["objects_sent"], again["bytes_sent"], again["refs_written"]) == (0, 0, 0)
    assert again["objects_present"] == pushed["objects_sent"]
    text = cli("bundle", "push", first, "--to", s3_url, env=env)
    assert text.returncode == 0 and "pushed 1 bundle(s) to s3://" in text.stdout and "0 bytes" in text.stdout

    listed = json.loads(cli("bundle", "list", "--json", "--store", s3_url, env=env).stdout)
    assert sorted(b["id"] for b in listed) == sorted([first, second])

    elsewhere = tmp_path / "elsewhere"
    pulled = _json(
        cli("bundle", "pull", second, "--from", s3_url, "--store", str(elsewhere), "--json", env=env)
    )
    captured = LocalStore(tmp_path / ".flaketriage")
    keys = [second, *(r.sha256 for r in read_manifest(captured, second).blobs())]
    assert pulled["bundles"] == [second]
    assert pulled["bytes_sent"] == sum(captured._object_path(k).stat().st_size for k in keys)
    verify = cli("bundle", "verify", second, "--store", str(elsewhere))
    assert verify.returncode == 0 and "ok: bundle" in verify.stdout
    for key in list(LocalStore(elsewhere).keys()):  # the same stored bytes as where it was captured
        rel = Path("objects", key[:2], key[2:])
        assert (elsewhere / rel).read_bytes() == (tmp_path / ".flaketriage" / rel).read_bytes()


def test_push_errors_are_one_line(cli, tmp_path: Path, s3_server: S3Server) -> None:  # type: ignore[no-untyped-def]
    bundle = _capture(cli, "raise ValueError('x')")
    env = s3_server.env
    _one_line_error(
        cli("bundle", "push", bundle, "--to", "s3://no-such-bucket/ft", env=env),
        "bucket 'no-such-bucket' does not exist",
    )
    dead = env | {"FLAKETRIAGE_S3_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}
    _one_line_error(
        cli("bundle", "push", bundle, "--to", "s3://flaketriage-tests/ft", env=dead),
        "cannot be reached",
        "FLAKETRIAGE_S3_ENDPOINT_URL",
    )
    _one_line_error(cli("bundle", "push", "ffffff", "--to", str(tmp_path / "x")), "no bundle ffffff")
    _one_line_error(
        cli("bundle", "push", bundle, "--to", "s3://Bad_Bucket/x", env=env), "does not name an S3 bucket"
    )
    _one_line_error(cli("bundle", "pull", bundle, "--from", str(tmp_path / "nowhere")), "no store at")


def _aged(store: Store, bundle_id: str, days: float) -> str:
    """The captured bundle as if captured `days` ago: the same manifest with an older date, written
    as a bundle of its own (its id changes with it), in place of the original."""
    manifest = read_manifest(store, bundle_id)
    older = manifest.model_copy(update={"created_at": datetime.now(UTC) - timedelta(days=days)})
    store.delete_ref(REF_PREFIX + bundle_id)
    return write_bundle(store, older)


def _quarantine(path: Path, bundle_id: str) -> None:
    when = datetime(2024, 5, 1, tzinfo=UTC)
    entry = QuarantineEntry(
        fingerprint="ab" * 16,
        reason="flaky",
        evidence=QuarantineEvidence(
            replays=20, reproductions=3, rate=FailureRate(estimate=0.15, low=0.03, high=0.38)
        ),
        command="python -c ...",
        bundle_id=bundle_id,
        occurrences=1,
        quarantined_at=when,
        updated_at=when,
    )
    path.write_bytes(QuarantineDocument().with_entry(entry).to_json())


def test_gc_drops_old_bundles_nobody_keeps(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    old = _capture(cli, "raise ValueError('old')")
    quarantined = _capture(cli, "raise ValueError('flaky')")
    new = _capture(cli, "raise ValueError('new')")
    root = tmp_path / ".flaketriage"
    store = LocalStore(root)
    old, quarantined = (_aged(store, b, days=45) for b in (old, quarantined))
    _quarantine(root / "quarantine.json", quarantined)
    before = sorted(store.keys())

    dry = _json(cli("gc", "--json", "--grace", "0"))
    assert dry["bundles"] == [old] and not dry["applied"] and dry["retained"] == 1
    assert sorted(store.keys()) == before
    text = cli("gc", "--grace", "0")
    assert "would drop 1 bundle(s)" in text.stdout and "--apply" in text.stdout

    done = _json(cli("gc", "--apply", "--json", "--grace", "0"))
    assert done["bundles"] == [old] and done["applied"]
    assert sorted(b["id"] for b in json.loads(cli("bundle", "list", "--json").stdout)) == sorted(
        [quarantined, new]
    )
    for bundle_id in (quarantined, new):
        assert cli("bundle", "verify", bundle_id).returncode == 0
    assert not store.has(old)
    assert _json(cli("gc", "--apply", "--json", "--older-than", "30d"))["bundles"] == []
    everything_old = _json(cli("gc", "--json", "--older-than", "0s"))
    assert everything_old["bundles"] == [new]  # the quarantined one is kept whatever its age
    _one_line_error(cli("gc", "--older-than", "a month"), "--older-than", "not a duration")


def test_gc_on_s3(cli, s3_url: str, s3_server: S3Server) -> None:  # type: ignore[no-untyped-def]
    env = s3_server.env
    kept, old = _capture(cli, "raise ValueError('kept')"), _capture(cli, "raise ValueError('old')")
    _json(cli("bundle", "push", kept, old, "--to", s3_url, "--json", env=env))
    old = _aged(open_store(s3_url, settings=load_settings()), old, days=40)
    dry = _json(cli("gc", "--store", s3_url, "--json", env=env))
    assert dry["bundles"] == [old] and dry["objects"] == [] and dry["skipped_young"]
    done = _json(cli("gc", "--store", s3_url, "--apply", "--grace", "0", "--json", env=env))
    # Its own blobs and the manifest it was written from, too young for the dry run's hour of grace.
    assert done["bundles"] == [old] and len(done["objects"]) == dry["skipped_young"] == 2  # type: ignore[arg-type]
    listed = json.loads(cli("bundle", "list", "--json", "--store", s3_url, env=env).stdout)
    assert [b["id"] for b in listed] == [kept]
    assert cli("bundle", "verify", kept, "--store", s3_url, env=env).returncode == 0


def test_gc_stops_when_a_manifest_cannot_be_read(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bundle = _capture(cli, "raise ValueError('x')")
    store = LocalStore(tmp_path / ".flaketriage")
    store._object_path(bundle).write_bytes(b"\x00damaged")
    orphan = store.put_bytes(b"nobody's").sha256
    proc = cli("gc", "--apply", "--grace", "0")
    assert proc.returncode == 1
    assert proc.stderr.startswith("warning:") and bundle in proc.stderr
    assert store.has(orphan)
