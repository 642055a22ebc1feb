"""What a bundle may contain: no link out of the workspace, no credential file, no secret in the
files it does hold, nothing readable by others in the store, and every file name as it was.

Through the real CLI in a fresh project: ``capture`` with links to ``/etc``, credential files and
tokens in the snapshot, untracked files and the diff; ``bundle export`` and ``triage`` (which
materializes the bundle) restoring links and names that are not UTF-8; hostile manifests whose
links point out of the workspace; and the store's file modes, private and shared.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from flaketriage.bundle.io import list_bundles, load_manifest, write_bundle
from flaketriage.bundle.manifest import FileEntry, Manifest
from flaketriage.store import Store, open_store
from tests.hostile.conftest import Sandbox, assert_no_traceback, assert_one_line_error

GITHUB_TOKEN = "ghp_" + "A1b2C3d4E5" * 3 + "F6g7H8"  # the shape of a GitHub token: ghp_ + 36
AWS_KEY = "AKIA" + "QWERTYUIOPASDFGH"  # the shape of an AWS access key id
PEM_KEY = (
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA7s3cr3t\nb0dyl1n3s\n-----END RSA PRIVATE KEY-----\n"
)


def store_of(sandbox: Sandbox) -> Store:
    return open_store(str(sandbox.store), readonly=True)


def only_manifest(sandbox: Sandbox) -> Manifest:
    store = store_of(sandbox)
    found = [load_manifest(store, s.id) for s in list_bundles(store)]
    assert len(found) == 1, found
    return found[0]


def all_stored_bytes(sandbox: Sandbox) -> bytes:
    """Every blob in the store (manifests included), decoded, one after the other."""
    store = store_of(sandbox)
    return b"\n".join(store.get_bytes(key) for key in store.keys())  # noqa: SIM118 (a Store, not a dict)


def capture(sandbox: Sandbox, *args: str, code: int = 3, env: dict[str, str] | None = None) -> Manifest:
    proc = sandbox.run("capture", *args, env=env)
    assert proc.returncode == code, (proc.stdout, proc.stderr)
    assert_no_traceback(proc)
    assert "captured bundle" in proc.stderr, proc.stderr
    return only_manifest(sandbox)


def git(sandbox: Sandbox, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=sandbox.project,
        env=sandbox.env(),
        check=True,
        capture_output=True,
    )


def git_repo(sandbox: Sandbox, files: dict[str, str]) -> None:
    for name, text in files.items():
        (sandbox.project / name).write_text(text)
    git(sandbox, "init", "-q")
    git(sandbox, "add", *files)
    git(sandbox, "commit", "-qm", "initial")


def excluded(manifest: Manifest) -> dict[str, str]:
    return {e.path: e.reason for e in manifest.excluded_files()}


# -- links ----------------------------------------------------------------------------------------


def test_a_link_out_of_the_workspace_is_never_followed(sandbox: Sandbox) -> None:
    (sandbox.project / "fail.py").write_text("raise SystemExit(3)\n")
    data = sandbox.project / "d"
    data.mkdir()
    (data / "rows.csv").write_text("a\n1\n")
    (data / "etc").symlink_to("/etc")
    (data / "passwd").symlink_to("/etc/passwd")
    (sandbox.project / "system").symlink_to("/etc")
    (sandbox.root / "elsewhere").mkdir()
    (sandbox.root / "elsewhere" / "secret.txt").write_text("elsewhere-marker\n")
    (data / "climb").symlink_to("../../elsewhere/secret.txt")

    manifest = capture(sandbox, "--data", "d", "--", sys.executable, "fail.py")

    (stored,) = manifest.data
    assert [f.path for f in stored.files] == ["rows.csv"]
    assert stored.items == 1
    left_out = excluded(manifest)
    for name, target in (("etc", "/etc"), ("passwd", "/etc/passwd"), ("climb", "../../elsewhere/secret.txt")):
        assert f"d/{name}" in left_out, left_out
        assert "outside the workspace" in left_out[f"d/{name}"] and target in left_out[f"d/{name}"]
    assert "system" in left_out and "outside the workspace" in left_out["system"]
    assert sorted(f.path for f in manifest.source.files) == ["d/rows.csv", "fail.py"]
    # Nothing of /etc (or of the outside directory) reached the store.
    everything = all_stored_bytes(sandbox)
    assert Path("/etc/passwd").read_bytes() not in everything
    assert b"elsewhere-marker" not in everything
    assert sum(p.stat().st_size for p in (sandbox.store / "objects").rglob("*") if p.is_file()) < 2_000_000
    shown = sandbox.run("bundle", "show", manifest.bundle_id[:12])
    assert shown.returncode == 0 and "left out" in shown.stdout and "/etc" in shown.stdout
    assert sandbox.outside_writes() == set()


# Fails the same way only when the links are there, as links, pointing where they pointed.
READS_LINKS = """\
import os
alias, linked_dir = os.readlink("d/alias"), os.readlink("lib")
raise SystemExit(f"links: {alias} {linked_dir} {open('abs').read().strip()} {sorted(os.listdir('lib'))}")
"""


def test_a_link_inside_the_workspace_round_trips_through_export_and_replay(sandbox: Sandbox) -> None:
    (sandbox.project / "fail.py").write_text(READS_LINKS)
    data = sandbox.project / "d"
    data.mkdir()
    (data / "real.txt").write_text("payload\n")
    (data / "alias").symlink_to("real.txt")
    (sandbox.project / "lib").symlink_to("d")
    (sandbox.project / "abs").symlink_to(data / "real.txt")  # absolute, but inside: kept relative

    manifest = capture(sandbox, "--data", "d", "--", sys.executable, "fail.py", code=1)
    links = {f.path: f.link for f in manifest.source.files if f.link is not None}
    assert links == {"d/alias": "real.txt", "lib": "d", "abs": "d/real.txt"}
    assert {f.path: f.link for f in manifest.data[0].files} == {"alias": "real.txt", "real.txt": None}
    assert "links: real.txt d payload" in manifest.failure.signature

    out = sandbox.root / "export"
    proc = sandbox.run("bundle", "export", manifest.bundle_id[:12], str(out))
    assert proc.returncode == 0, proc.stderr
    workspace = out / "workspace"
    for name, target in links.items():
        assert (workspace / name).is_symlink() and os.readlink(workspace / name) == target
        assert (workspace / name).resolve().is_relative_to(workspace.resolve())
    assert (workspace / "abs").read_text() == "payload\n"

    triage = sandbox.run("triage", manifest.bundle_id[:12], "--json", "--max-replays", "4")
    assert triage.returncode == 0, triage.stderr
    result = json.loads(triage.stdout)
    assert result["verdict"] == "deterministic" and result["failures"] == result["replays"], result
    assert sandbox.outside_writes() == set()


HOSTILE_TARGETS = ["/etc", "/etc/passwd", "..", "../outside", "../../..", "x/../..", "./../etc", ""]


@pytest.mark.parametrize("target", HOSTILE_TARGETS)
@pytest.mark.parametrize("where", ["source", "data"])
def test_a_manifest_link_out_of_the_workspace_is_refused_on_restore(
    sandbox: Sandbox, target: str, where: str
) -> None:
    (sandbox.project / "fail.py").write_text("raise SystemExit(3)\n")
    (sandbox.project / "d").mkdir()
    (sandbox.project / "d" / "rows.txt").write_text("x\n")
    manifest = capture(sandbox, "--data", "d", "--", sys.executable, "fail.py")
    if where == "data" and target.startswith(".."):
        target = "../" + target  # the data directory is one level down: climb one more to leave
    store = open_store(str(sandbox.store))
    ref = store.put_bytes(target.encode())
    evil = FileEntry(path="evil", sha256=ref.sha256, size=ref.size, link=target)
    if where == "source":
        src = manifest.source
        hostile = manifest.model_copy(update={"source": src.model_copy(update={"files": (*src.files, evil)})})
    else:
        (data,) = manifest.data
        data = data.model_copy(update={"files": (*data.files, evil)})
        hostile = manifest.model_copy(update={"data": (data,)})
    bundle = write_bundle(store, hostile)[:12]

    out = sandbox.root / "export"
    proc = sandbox.run("bundle", "export", bundle, str(out))
    assert_one_line_error(proc, 2, "link 'evil'", "only point inside the workspace")
    assert not out.exists()
    proc = sandbox.run("triage", bundle, "--max-replays", "2")
    assert_one_line_error(proc, 2, "link 'evil'", "only point inside the workspace")
    verify = sandbox.run("bundle", "verify", bundle)
    assert verify.returncode == 1 and "link 'evil'" in verify.stderr, verify.stderr
    assert_no_traceback(verify)
    assert sandbox.outside_writes() == set()


def test_a_manifest_link_is_judged_from_where_it_really_lands(sandbox: Sandbox) -> None:
    # The commit holds `a -> .`, so `a/b/evil` lands in `b/`, one level down, not two: its target
    # `../../outside` reads as inside from the manifest, and leaves the workspace on disk.
    git_repo(sandbox, {"fail.py": "raise SystemExit(3)\n"})
    (sandbox.project / "a").symlink_to(".")
    git(sandbox, "add", "a")
    git(sandbox, "commit", "-qm", "a link to itself")
    manifest = capture(sandbox, "--", sys.executable, "fail.py")
    store = open_store(str(sandbox.store))
    ref = store.put_bytes(b"../../outside")
    evil = FileEntry(path="a/b/evil", sha256=ref.sha256, size=ref.size, link="../../outside")
    src = manifest.source.model_copy(update={"files": (*manifest.source.files, evil)})
    bundle = write_bundle(store, manifest.model_copy(update={"source": src}))[:12]

    out = sandbox.root / "export"
    proc = sandbox.run("bundle", "export", bundle, str(out))
    assert_one_line_error(proc, 2, "link 'a/b/evil'", "climbs out of the workspace")
    assert not out.exists()
    assert sandbox.outside_writes() == set()


# -- credential files -----------------------------------------------------------------------------

CREDENTIAL_FILES = [
    ".env",
    ".env.production",
    "server.pem",
    "tls.key",
    "id_rsa",
    "id_rsa.pub",
    "id_ed25519",
    ".netrc",
    ".pypirc",
    ".npmrc",
    ".git-credentials",
    ".aws/credentials",
    ".docker/config.json",
    "deploy/.env",
]


@pytest.mark.parametrize("name", CREDENTIAL_FILES)
def test_a_credential_file_is_never_captured(sandbox: Sandbox, name: str) -> None:
    (sandbox.project / "fail.py").write_text("raise SystemExit(3)\n")
    secret = sandbox.project / name
    secret.parent.mkdir(parents=True, exist_ok=True)
    marker = f"credential-marker-{name}"
    secret.write_text(f"{marker}\n")
    manifest = capture(sandbox, "--", sys.executable, "fail.py")
    assert name not in {f.path for f in manifest.source.files}
    assert "credential file" in excluded(manifest)[name]
    assert marker.encode() not in all_stored_bytes(sandbox).replace(name.encode(), b"")
    assert sandbox.outside_writes() == set()


def test_credential_files_are_left_out_of_untracked_files_and_the_diff(sandbox: Sandbox) -> None:
    git_repo(sandbox, {"fail.py": "raise SystemExit(3)\n", ".env": "A=committed\n", "app.py": "x = 1\n"})
    (sandbox.project / ".env").write_text("A=committed\nB=uncommitted-marker\n")
    (sandbox.project / "app.py").write_text("x = 2\n")
    (sandbox.project / "keys").mkdir()
    (sandbox.project / "keys" / "id_ed25519").write_text("untracked-marker\n")
    manifest = capture(sandbox, "--", sys.executable, "fail.py")
    assert manifest.source.kind == "git" and manifest.source.diff is not None
    left_out = excluded(manifest)
    assert "credential file" in left_out[".env"] and "credential file" in left_out["keys/id_ed25519"]
    diff = store_of(sandbox).get_bytes(manifest.source.diff.sha256)
    assert b"+x = 2" in diff and b".env" not in diff
    everything = all_stored_bytes(sandbox)
    assert b"uncommitted-marker" not in everything and b"untracked-marker" not in everything
    assert sandbox.outside_writes() == set()


# -- secrets inside captured files ----------------------------------------------------------------

SETTINGS_V1 = "DEBUG = True\n\n\ndef login(password: str) -> str:\n    return password\n"
SETTINGS_V2 = (
    f'DEBUG = True\nTOKEN = "{GITHUB_TOKEN}"\nKEY = """{PEM_KEY}"""\n\n\n'
    "def login(password: str) -> str:\n    return password\n\n\nLATER = 1\n"
)
USES_SETTINGS = "import settings\nraise SystemExit(f'failed with debug={settings.DEBUG}')\n"


def test_secrets_in_the_diff_and_untracked_files_are_masked_and_the_diff_still_applies(
    sandbox: Sandbox,
) -> None:
    git_repo(sandbox, {"fail.py": USES_SETTINGS, "settings.py": SETTINGS_V1})
    (sandbox.project / "settings.py").write_text(SETTINGS_V2)
    (sandbox.project / "notes.txt").write_text(f"aws key {AWS_KEY} for staging\n")
    (sandbox.project / "config.yaml").write_text("user: ci\npassword: hunter2-staging\n")
    (sandbox.project / "plain.txt").write_text("nothing to hide\n")

    manifest = capture(sandbox, "--", sys.executable, "fail.py", code=1)
    src = manifest.source
    assert src.kind == "git" and src.diff is not None
    assert set(src.masked) == {"settings.py", "notes.txt", "config.yaml"}
    store = store_of(sandbox)
    diff = store.get_bytes(src.diff.sha256).decode()
    assert GITHUB_TOKEN not in diff and "MIIEpAIBAAKCAQEA7s3cr3t" not in diff
    assert '+TOKEN = "[REDACTED]"' in diff and "def login(password: str)" in diff
    files = {f.path: store.get_bytes(f.sha256).decode() for f in src.files}
    assert files["notes.txt"] == "aws key [REDACTED] for staging\n"
    assert files["config.yaml"] == "user: ci\npassword: [REDACTED]\n"
    assert files["plain.txt"] == "nothing to hide\n"
    everything = all_stored_bytes(sandbox)
    for secret in (GITHUB_TOKEN, AWS_KEY, "hunter2-staging", "b0dyl1n3s"):
        assert secret.encode() not in everything, secret

    shown = sandbox.run("bundle", "show", manifest.bundle_id[:12])
    assert shown.returncode == 0 and "masked" in shown.stdout and "notes.txt" in shown.stdout
    # The masked diff still applies to the commit: replays reproduce, and the report says what was masked.
    triage = sandbox.run("triage", manifest.bundle_id[:12], "--json", "--max-replays", "3")
    assert triage.returncode == 0, triage.stderr
    result = json.loads(triage.stdout)
    assert result["verdict"] == "deterministic", result
    issues = list((sandbox.store / "issues").glob("*.md"))
    assert len(issues) == 1 and "Masked" in issues[0].read_text() and "settings.py" in issues[0].read_text()
    assert sandbox.outside_writes() == set()


def test_secrets_in_snapshot_files_are_masked(sandbox: Sandbox) -> None:
    (sandbox.project / "fail.py").write_text(
        f'TOKEN = "{GITHUB_TOKEN}"\n\n\ndef login(password: str) -> None:\n'
        '    raise SystemExit(3)\n\n\nlogin("x")\n'
    )
    (sandbox.project / "app.cfg").write_text(f"[aws]\naccess_key_id = {AWS_KEY}\nregion = eu-west-1\n")
    manifest = capture(sandbox, "--", sys.executable, "fail.py")
    src = manifest.source
    assert src.kind == "snapshot" and set(src.masked) == {"fail.py", "app.cfg"}
    store = store_of(sandbox)
    files = {f.path: store.get_bytes(f.sha256).decode() for f in src.files}
    assert 'TOKEN = "[REDACTED]"' in files["fail.py"]
    assert "def login(password: str) -> None:" in files["fail.py"]  # code is masked by value only
    assert files["app.cfg"] == "[aws]\naccess_key_id = [REDACTED]\nregion = eu-west-1\n"
    assert GITHUB_TOKEN.encode() not in all_stored_bytes(sandbox)
    shown = sandbox.run("bundle", "show", manifest.bundle_id[:12])
    assert shown.returncode == 0 and "masked" in shown.stdout and "app.cfg" in shown.stdout
    assert sandbox.outside_writes() == set()


# -- the store's modes ----------------------------------------------------------------------------


@pytest.mark.parametrize(("shared", "file_mode", "dir_mode"), [(False, 0o600, 0o700), (True, 0o640, 0o2770)])
def test_store_objects_are_private_unless_the_store_is_shared(
    sandbox: Sandbox, shared: bool, file_mode: int, dir_mode: int
) -> None:
    (sandbox.project / "fail.py").write_text("raise SystemExit(3)\n")
    env = {"FLAKETRIAGE_STORE_SHARED": "true"} if shared else {}
    capture(sandbox, "--", sys.executable, "fail.py", env=env)
    store = sandbox.store
    dirs = [store, *(store / sub for sub in ("objects", "refs", "tmp"))]
    files = []
    for sub in ("objects", "refs"):
        for path in (store / sub).rglob("*"):
            (dirs if path.is_dir() else files).append(path)
    assert len(files) >= 4  # the manifest, its index entry and the logs, at least
    for path in dirs:
        assert stat.S_IMODE(path.stat().st_mode) == dir_mode, (path, oct(path.stat().st_mode))
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == file_mode, (path, oct(path.stat().st_mode))
    assert sandbox.outside_writes() == set()


# -- file names that are not UTF-8 ------------------------------------------------------------------

# Fails (exit 3) only when both files are there under exactly their original names and contents.
SEES_BYTE_NAMES = """\
import os, sys
top = os.listdir(b".")
inner = os.listdir(b"d")
ok = b"bad\\xff.txt" in top and b"x\\xfe.txt" in inner
with open(b"bad\\xff.txt", "rb") as a, open(b"d/x\\xfe.txt", "rb") as b:
    ok = ok and a.read() == b"payload\\n" and b.read() == b"1\\n"
sys.exit(3 if ok else 0)
"""


@pytest.mark.parametrize("kind", ["snapshot", "git"])
def test_a_file_name_that_is_not_utf8_is_captured_and_restored_as_it_was(sandbox: Sandbox, kind: str) -> None:
    if kind == "git":
        git_repo(sandbox, {"fail.py": SEES_BYTE_NAMES})
    else:
        (sandbox.project / "fail.py").write_text(SEES_BYTE_NAMES)
    (sandbox.project / os.fsdecode(b"bad\xff.txt")).write_bytes(b"payload\n")
    (sandbox.project / "d").mkdir()
    (sandbox.project / "d" / os.fsdecode(b"x\xfe.txt")).write_bytes(b"1\n")

    manifest = capture(sandbox, "--data", "d", "--", sys.executable, "fail.py")
    assert manifest.source.kind == kind
    names = {os.fsencode(f.path) for f in manifest.source.files}
    assert b"bad\xff.txt" in names
    assert [os.fsencode(f.path) for f in manifest.data[0].files] == [b"x\xfe.txt"]

    out = sandbox.root / "export"
    proc = sandbox.run("bundle", "export", manifest.bundle_id[:12], str(out))
    assert proc.returncode == 0, proc.stderr
    workspace = os.fsencode(out / "workspace")
    with open(os.path.join(workspace, b"bad\xff.txt"), "rb") as restored:
        assert restored.read() == b"payload\n"
    assert os.listdir(os.path.join(workspace, b"d")) == [b"x\xfe.txt"]

    triage = sandbox.run("triage", manifest.bundle_id[:12], "--json", "--max-replays", "3")
    assert triage.returncode == 0, triage.stderr
    result = json.loads(triage.stdout)
    assert result["verdict"] == "deterministic" and result["failures"] == result["replays"], result
    assert sandbox.outside_writes() == set()
