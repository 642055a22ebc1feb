"""Issue rendering and the issue sinks: one issue per fingerprint, updated rather than duplicated."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import flaketriage
from flaketriage.bundle.manifest import (
    GPU,
    Command,
    DataInput,
    Environment,
    Failure,
    Hardware,
    Manifest,
    Minimization,
    Provenance,
    Source,
)
from flaketriage.errors import ReportError
from flaketriage.settings import DEFAULT_OUTPUT_TAIL_LINES, load_settings
from flaketriage.store import LocalStore, Store
from flaketriage.workers.report import (
    IssueDraft,
    IssueRecord,
    IssueSink,
    MarkdownIssueSink,
    MemoryIssueSink,
    issue_title,
    render_issue,
)
from flaketriage.workers.verdict import RateInterval, Verdict, VerdictResult

FP = "ab" * 32
RUN_URL = "https://github.com/acme/repo/actions/runs/42"
TRACEBACK = textwrap.dedent(
    """\
    Traceback (most recent call last):
      File "/home/ci/repo/train.py", line 12, in <module>
        main()
      File "/home/ci/repo/train.py", line 9, in main
        loss = total / count
      File "/usr/lib/python3.11/site-packages/numpy/core/_methods.py", line 3, in _mean
        raise ZeroDivisionError("division by zero")
    ZeroDivisionError: division by zero
    """
)


def issue_manifest(store: Store, **failure: object) -> Manifest:
    stderr = "\n".join(f"stderr line {i}" for i in range(100)) + "\n"
    fields: dict[str, object] = {
        "kind": "exception",
        "exit_code": 1,
        "exception_type": "ZeroDivisionError",
        "message": "division by zero",
        "traceback": TRACEBACK,
        "fingerprint": FP,
        "signature": "ZeroDivisionError|train.py:main",
    }
    fields.update(failure)
    return Manifest(
        command=Command(argv=("python", "train.py", "--lr", "0.1"), cwd="/home/ci/repo"),
        source=Source(
            kind="git",
            commit="0123456789abcdef0123456789abcdef01234567",
            branch="main",
            remote="https://github.com/acme/repo.git",
            diff=store.put_bytes(b"diff --git a/train.py b/train.py\n"),
        ),
        failure=Failure.model_validate(fields),
        environment=Environment(
            python="3.11.7",
            implementation="CPython",
            platform="Linux",
            machine="x86_64",
            packages=("flaketriage==0.1.0", "numpy==1.26.4", "requests==2.31.0", "torch==2.3.0+cu121"),
        ),
        hardware=Hardware(
            host="gpu-runner-7",
            gpus=(GPU(index=0, name="NVIDIA A100"), GPU(index=1, name="NVIDIA A100")),
            cuda_version="12.1",
            driver_version="535.104",
        ),
        logs={"stderr": store.put_bytes(stderr.encode()), "stdout": store.put_bytes(b"ok\n")},
        provenance=Provenance(
            ci_provider="github-actions",
            run_url=RUN_URL,
            job="train",
            attempt="2",
        ),
    )


def deterministic() -> VerdictResult:
    return VerdictResult(
        verdict=Verdict.DETERMINISTIC,
        decided=True,
        replays=5,
        reproductions=5,
        passes=0,
        different=0,
        rate=RateInterval(estimate=1.0, low=0.4782, high=1.0),
    )


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "store")


# -- rendering ------------------------------------------------------------------------------------
def test_render_has_every_section_with_its_evidence(store: LocalStore) -> None:
    manifest = issue_manifest(store)
    minimal = manifest.model_copy(
        update={
            "command": Command(argv=("python", "train.py", "--lr", "1"), cwd="/home/ci/repo"),
            "data": (DataInput(path="data/train.csv", format="csv", items=3),),
            "minimization": Minimization(
                data={"data/train.csv": (3, 1000)}, args={"--lr": ("0.1", "1")}, oracle_calls=17
            ),
            "parent": "p" * 64,
        }
    )
    draft = render_issue(
        store,
        manifest,
        "1" * 64,
        deterministic(),
        minimal=minimal,
        minimal_bundle_id="2" * 64,
        store_location="s3://bundles/flaky",
        findings=["replay 3 failed with RuntimeError: CUDA error (fingerprint cdcd...)"],
        tail_lines=30,
    )
    body = draft.body
    assert draft.title == "[flaketriage] train.py: ZeroDivisionError: division by zero (deterministic)"
    assert draft.labels == ("flaketriage", "deterministic")
    assert (draft.fingerprint, draft.verdict) == (FP, "deterministic")
    assert (draft.bundle_id, draft.minimal_bundle_id) == ("1" * 64, "2" * 64)
    assert "**Verdict: deterministic**" in body
    assert "reproduced in 5 of 5 replays" in body
    assert "reproduction rate 100.0% (95% interval 47.8%–100.0%)" in body
    assert "decided by the sequential test" in body
    assert f"Fingerprint: `{FP}`" in body
    assert "`ZeroDivisionError|train.py:main`" in body
    # The failure: traceback fenced, and exactly the last 30 lines of stderr.
    assert "```pytb\n" + TRACEBACK.rstrip() + "\n```" in body
    assert "stderr line 99" in body and "stderr line 70" in body
    assert "stderr line 69\n" not in body
    assert "## Other findings\n\n- replay 3 failed with RuntimeError" in body
    # Environment.
    for row in (
        "| Python | 3.11.7 (CPython) |",
        "| Platform | Linux x86_64 |",
        "| torch | 2.3.0+cu121 |",
        "| numpy | 1.26.4 |",
        "| GPUs | 2 × NVIDIA A100 |",
        "| CUDA | CUDA 12.1 / driver 535.104 |",
        "| Host | gpu-runner-7 |",
        "| CI | github-actions, job train, attempt 2 |",
        f"| CI run | [{RUN_URL}]({RUN_URL}) |",
    ):
        assert row in body
    assert "| requests |" not in body  # only the packages that explain numeric failures
    # Source.
    assert "| Commit | `0123456789abcdef0123456789abcdef01234567` |" in body
    assert "| Branch | main |" in body and "| Remote | https://github.com/acme/repo.git |" in body
    assert "| Uncommitted changes | yes (" in body
    # Minimal reproduction and how to fetch the bundle.
    assert "- `data/train.csv`: kept 3 of 1000 rows" in body
    assert "- `--lr`: `0.1` → `1`" in body
    assert "Minimized command: `python train.py --lr 1` (found in 17 replays)" in body
    assert f"flaketriage bundle export {'2' * 64} repro && cd repro && bash run.sh" in body
    assert f"flaketriage triage {'1' * 64}" in body
    assert "export FLAKETRIAGE_STORE=s3://bundles/flaky" in body
    assert f"flaketriage bundle show {'1' * 64}" in body
    order = ["**Verdict", "## Failure", "## Other findings", "## Environment", "## Source"]
    order += ["## Minimal reproduction", "## Bundle"]
    positions = [body.index(heading) for heading in order]
    assert positions == sorted(positions)


def test_render_flaky_undecided_environment_specific_without_minimization(store: LocalStore) -> None:
    result = VerdictResult(
        verdict=Verdict.FLAKY,
        decided=False,
        replays=7,
        reproductions=3,
        passes=3,
        different=1,
        rate=RateInterval(estimate=3 / 7, low=0.099, high=0.816),
    )
    draft = render_issue(
        store,
        issue_manifest(store),
        "1" * 64,
        result,
        minimal=None,
        minimal_bundle_id=None,
        environment_specific=True,
    )
    assert draft.labels == ("flaketriage", "flaky", "suspected-environment")
    assert "reproduced in 3 of 7 replays (3 passed, 1 failed differently)" in draft.body
    assert "reproduction rate 42.9% (95% interval 9.9%–81.6%)" in draft.body
    assert "**undecided**" in draft.body
    assert "Suspected environment-specific" in draft.body
    assert "was not minimized" in draft.body
    assert f"flaketriage bundle export {'1' * 64} repro" in draft.body
    assert f"export FLAKETRIAGE_STORE={store.location}" in draft.body  # defaults to the store's own


def test_render_survives_a_missing_stderr_blob_and_backticks_in_the_traceback(tmp_path: Path) -> None:
    full = LocalStore(tmp_path / "full")
    manifest = issue_manifest(full, traceback="Traceback:\n  ```weird``` frame\nValueError: x")
    empty = LocalStore(tmp_path / "empty")
    draft = render_issue(empty, manifest, "1" * 64, deterministic(), minimal=None, minimal_bundle_id=None)
    assert "_The stderr log could not be read:" in draft.body
    assert "````pytb\nTraceback:\n  ```weird``` frame\nValueError: x\n````" in draft.body


@pytest.mark.parametrize(
    ("failure", "argv", "expected"),
    [
        (
            {"kind": "exit", "exit_code": 3, "exception_type": None, "message": None, "traceback": None},
            ("bash", "ci/train.sh", "--fast"),
            "[flaketriage] bash ci/train.sh --fast: exit 3",
        ),
        (
            {"kind": "test", "test_id": "tests/test_model.py::test_grad[cuda]",
             "exception_type": "AssertionError", "message": "assert 0.5 < 0.1\n where",
             "traceback": None},
            ("pytest", "tests"),
            "[flaketriage] tests/test_model.py::test_grad[cuda]: AssertionError: assert 0.5 < 0.1",
        ),
        (
            {"kind": "signal", "signal": "SIGSEGV", "exception_type": None, "message": None,
             "traceback": None},
            ("python", "train.py"),
            "[flaketriage] python train.py: killed by SIGSEGV",
        ),
    ],
)  # fmt: skip
def test_title_names_the_test_or_command_when_there_is_no_python_frame(
    store: LocalStore, failure: dict[str, object], argv: tuple[str, ...], expected: str
) -> None:
    manifest = issue_manifest(store, **failure).model_copy(
        update={"command": Command(argv=argv, cwd="/home/ci/repo")}
    )
    assert issue_title(manifest) == expected


def test_title_is_clipped_to_120_characters_keeping_where_and_verdict(store: LocalStore) -> None:
    manifest = issue_manifest(store, message="shapes do not match: " + "x" * 300)
    title = issue_title(manifest, "deterministic")
    assert len(title) <= 120
    assert title.startswith("[flaketriage] train.py: ZeroDivisionError: shapes do not match: xxx")
    assert title.endswith("x… (deterministic)")


def test_a_long_title_is_cut_between_words_and_the_body_holds_the_whole_message(store: LocalStore) -> None:
    message = (
        "bad price for SKU-0137: -4.99 is below zero; prices must be at least 0.00 and the catalogue "
        "row 1182 says otherwise for warehouse EU-WEST-2 " + "and more words " * 20
    )
    manifest = issue_manifest(store, message=message)
    title = issue_title(manifest, "deterministic")
    assert len(title) <= 120 and title.endswith("… (deterministic)")
    kept = title.removeprefix("[flaketriage] train.py: ZeroDivisionError: ").removesuffix("… (deterministic)")
    assert message.startswith(kept) and message[len(kept)] == " "  # the cut is between words
    draft = render_issue(store, manifest, "1" * 64, deterministic(), minimal=None, minimal_bundle_id=None)
    assert f"Message:\n\n```text\n{message}\n```" in draft.body


def test_a_short_message_is_not_repeated_below_the_table(store: LocalStore) -> None:
    manifest = issue_manifest(store, message="division by zero")
    draft = render_issue(store, manifest, "1" * 64, deterministic(), minimal=None, minimal_bundle_id=None)
    assert "Message:" not in draft.body and "| Message | division by zero |" in draft.body


# -- sinks ----------------------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        self.now += timedelta(hours=1)
        return self.now


def draft(bundle: str, body: str = "evidence", fingerprint: str = FP) -> IssueDraft:
    return IssueDraft(
        fingerprint=fingerprint,
        title="[flaketriage] ZeroDivisionError: division by zero in train.py",
        body=f"**Verdict: flaky**\n\n{body}\n",
        labels=("flaketriage", "flaky"),
        bundle_id=bundle,
        minimal_bundle_id=None,
        verdict="flaky",
    )


@pytest.fixture(params=["markdown", "memory"])
def sink(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[IssueSink]:
    clock = Clock()
    yield (
        MarkdownIssueSink(tmp_path / "issues", clock=clock)
        if request.param == "markdown"
        else (MemoryIssueSink(clock=clock))
    )


def test_a_recurring_failure_updates_its_one_issue(sink: IssueSink) -> None:
    assert sink.find(FP) is None and sink.get(FP) is None
    first = sink.upsert(draft("a" * 64, "first evidence"))
    assert first.created and first.kind == sink.kind
    second = sink.upsert(draft("b" * 64, "second evidence"))
    again = sink.upsert(draft("b" * 64, "third evidence"))
    assert not second.created and not again.created
    assert first.location == second.location == again.location
    assert sink.find(FP) == again
    record = sink.get(FP)
    assert record is not None
    assert record.occurrences == 3
    assert record.bundles == ("a" * 64, "b" * 64)  # each bundle listed once
    assert record.created_at == datetime(2024, 5, 1, 13, 0, tzinfo=UTC)  # first seen is kept
    assert record.updated_at == datetime(2024, 5, 1, 15, 0, tzinfo=UTC)
    assert "third evidence" in record.body and "first evidence" not in record.body


def test_another_fingerprint_gets_its_own_issue(sink: IssueSink) -> None:
    one = sink.upsert(draft("a" * 64))
    other = sink.upsert(draft("a" * 64, fingerprint="cd" * 32))
    assert one.created and other.created and one.location != other.location


def test_sinks_refuse_a_fingerprint_that_is_not_hex(sink: IssueSink) -> None:
    with pytest.raises(ReportError, match="not a failure fingerprint"):
        sink.upsert(draft("a" * 64, fingerprint="../../etc/passwd"))


def test_markdown_issue_file_reads_as_markdown_and_parses_back(tmp_path: Path) -> None:
    sink = MarkdownIssueSink(tmp_path / "issues", clock=Clock())
    ref = sink.upsert(draft("a" * 64, "a body with -- dashes --> and `code`"))
    sink.upsert(draft("b" * 64, "a body with -- dashes --> and `code`"))
    path = tmp_path / "issues" / f"{FP[:16]}.md"
    assert ref.location == str(path)
    text = path.read_text()
    assert text.startswith(
        "# [flaketriage] ZeroDivisionError: division by zero in train.py\n\n<!-- flaketriage-issue {"
    )
    assert "seen 2 times" in text and "First seen 2024-05-01 13:00 UTC" in text
    assert text.rstrip().endswith(f"## Occurrences\n\n1. `{'a' * 64}`\n2. `{'b' * 64}`")
    record = IssueRecord.parse(text, "the file")
    assert record.body == "**Verdict: flaky**\n\na body with -- dashes --> and `code`"
    assert (record.fingerprint, record.occurrences) == (FP, 2)
    assert sorted(p.name for p in path.parent.iterdir()) == [".flaketriage-issues.lock", path.name]


def test_markdown_issue_without_metadata_is_reported_not_overwritten(tmp_path: Path) -> None:
    sink = MarkdownIssueSink(tmp_path)
    path = tmp_path / f"{FP[:16]}.md"
    path.write_text("# someone's notes\n")
    with pytest.raises(ReportError, match=f"{path}.*no flaketriage metadata comment"):
        sink.upsert(draft("a" * 64))
    path.write_text("<!-- flaketriage-issue {not json} -->\n")
    with pytest.raises(ReportError, match="damaged flaketriage metadata"):
        sink.upsert(draft("a" * 64))
    assert path.read_text() == "<!-- flaketriage-issue {not json} -->\n"


def test_markdown_sink_refuses_a_file_of_another_fingerprint(tmp_path: Path) -> None:
    sink = MarkdownIssueSink(tmp_path)
    sink.upsert(draft("a" * 64))
    twin = FP[:16] + "cd" * 24
    with pytest.raises(ReportError, match="collide"):
        sink.upsert(draft("b" * 64, fingerprint=twin))


def test_markdown_sink_names_an_unwritable_directory(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ReportError, match="FLAKETRIAGE_ISSUES_DIR"):
        MarkdownIssueSink(blocker / "issues").upsert(draft("a" * 64))


_UPSERTS = """
import sys
from pathlib import Path
from flaketriage.workers.report import IssueDraft, MarkdownIssueSink
from flaketriage.settings import load_settings
sink = MarkdownIssueSink(Path(sys.argv[1]))
for i in range(int(sys.argv[3])):
    sink.upsert(IssueDraft(fingerprint=sys.argv[4], title="t", body="b", labels=("flaketriage",),
                           bundle_id=f"{sys.argv[2]}-{i}", minimal_bundle_id=None, verdict="flaky"))
"""


def test_concurrent_processes_never_lose_an_occurrence(tmp_path: Path) -> None:
    root = Path(flaketriage.__file__).parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    procs = [
        subprocess.Popen([sys.executable, "-c", _UPSERTS, str(tmp_path), f"w{n}", "15", FP], env=env)
        for n in range(4)
    ]
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0, 0]
    record = MarkdownIssueSink(tmp_path).get(FP)
    assert record is not None
    assert record.occurrences == 60
    assert len(record.bundles) == 60


def test_memory_sink_keeps_records_by_fingerprint() -> None:
    sink = MemoryIssueSink()
    ref = sink.upsert(draft("a" * 64))
    assert (ref.kind, ref.location, ref.created) == ("memory", f"memory:{FP[:16]}", True)
    assert list(sink.issues) == [FP]


def test_the_stderr_tail_has_the_configured_length(store: LocalStore) -> None:
    manifest = issue_manifest(store)
    short = render_issue(store, manifest, "1" * 64, deterministic(), tail_lines=5).body
    assert "Last 5 lines of stderr" in short
    assert "stderr line 95" in short and "stderr line 94\n" not in short
    default = render_issue(store, manifest, "1" * 64, deterministic()).body
    assert f"Last {DEFAULT_OUTPUT_TAIL_LINES} lines of stderr" in default
    assert "stderr line 0\n" in default  # all 100 lines fit in the default tail


# -- idempotency keys and closing, in every sink ----------------------------------------------------
def test_an_upsert_with_a_key_already_counted_changes_nothing(sink: IssueSink) -> None:
    keyed = replace(draft("a" * 64), key="triage-1")
    assert sink.upsert(keyed).created
    again = sink.upsert(replace(keyed, body="**Verdict: flaky**\n\nretried\n"))
    assert not again.created
    record = sink.get(FP)
    assert record is not None and record.occurrences == 1 and record.keys == ("triage-1",)
    assert "retried" not in record.body
    sink.upsert(replace(draft("b" * 64), key="triage-2"))
    sink.upsert(replace(draft("b" * 64), key="triage-2"))
    record = sink.get(FP)
    assert record is not None and record.occurrences == 2 and record.keys == ("triage-1", "triage-2")


def test_closing_marks_the_issue_closed_once_and_a_recurrence_reopens_it(sink: IssueSink) -> None:
    assert sink.close(FP, "Fixed") is None  # nothing to close
    sink.upsert(draft("a" * 64))
    closed = sink.close(FP, "**Fixed**: the quarantine is lifted.\n\nmore detail")
    assert closed is not None and not closed.created
    record = sink.get(FP)
    assert record is not None and record.state == "closed"
    assert record.note == "Closed 2024-05-01 14:00 UTC: **Fixed**: the quarantine is lifted."
    assert sink.close(FP, "again") == closed
    record = sink.get(FP)
    assert record is not None and record.note and record.note.startswith("Closed 2024-05-01 14:00")
    sink.upsert(draft("b" * 64))
    record = sink.get(FP)
    assert record is not None and record.state == "open" and record.occurrences == 2
    assert record.note == "Reopened 2024-05-01 15:00 UTC: the failure came back after the issue was closed."


def test_a_closed_markdown_issue_says_so_and_parses_back(tmp_path: Path) -> None:
    sink = MarkdownIssueSink(tmp_path, clock=Clock())
    sink.upsert(draft("a" * 64))
    sink.close(FP, "Fixed by the isolated reruns")
    text = (tmp_path / f"{FP[:16]}.md").read_text()
    assert "> **Closed 2024-05-01 14:00 UTC: Fixed by the isolated reruns**" in text
    assert f"<!-- flaketriage-fingerprint: {FP} -->" in text
    assert IssueRecord.parse(text, "x").state == "closed"


# -- the reproduction's data in the issue -----------------------------------------------------------
def _with_data(store: Store, manifest: Manifest, *inputs: tuple[str, bytes, str]) -> Manifest:
    data = tuple(
        DataInput(path=path, format=fmt, items=raw.count(b"\n"), blob=store.put_bytes(raw))  # type: ignore[arg-type]
        for path, raw, fmt in inputs
    )
    return manifest.model_copy(
        update={
            "data": data,
            "minimization": Minimization(data={p: (raw.count(b"\n"), 1000) for p, raw, _ in inputs}),
        }
    )


def test_small_minimal_data_is_inline_and_large_data_is_an_excerpt_and_a_key(store: LocalStore) -> None:
    manifest = issue_manifest(store)
    big = b"id,x\n" + b"".join(b"%d,%d\n" % (i, i * i) for i in range(5000))
    minimal = _with_data(
        store,
        manifest,
        ("data/train.csv", b"id,x\n17,nan\n", "csv"),
        ("data/events.jsonl", b'{"id": 1, "note": "``` @octocat"}\n', "jsonl"),
        ("data/big.csv", big, "csv"),
    )
    body = render_issue(
        store, manifest, "1" * 64, deterministic(), minimal=minimal, minimal_bundle_id="2" * 64
    ).body
    assert "## Minimal data" in body
    assert "- `data/train.csv` (csv, 2 rows, 12 bytes):\n\n```csv\nid,x\n17,nan\n```" in body
    assert '````json\n{"id": 1, "note": "``` @octocat"}\n````' in body  # a fence its content cannot close
    big_ref = minimal.data[2].blob
    assert big_ref is not None
    assert (
        f"- `data/big.csv` (csv, 5001 rows, {len(big) / 1024:.1f} KB): store key `{big_ref.sha256}`" in body
    )
    assert "The first " in body and "0,0\n1,1\n2,4\n" in body and "4999,24990001" not in body
    assert f"`flaketriage bundle pull {'2' * 64} --from {store.location}` copies them all" in body
    inline = body[body.index("## Minimal data") : body.index("## Bundle")]
    assert len(inline.encode()) < 6000  # a few KB, whatever the data's size


def test_data_of_an_s3_store_is_linked_by_presigned_urls(s3_url: str, tmp_path: Path) -> None:
    import httpx
    import zstandard

    from flaketriage.store.s3 import S3Store

    store = S3Store.from_url(s3_url, settings=load_settings())
    manifest = issue_manifest(store)
    big = b"id,x\n" + b"".join(b"%d,%d\n" % (i, i * i) for i in range(3000))
    minimal = _with_data(store, manifest, ("data/big.csv", big, "csv"))
    body = render_issue(
        store,
        manifest,
        "1" * 64,
        deterministic(),
        minimal=minimal,
        minimal_bundle_id="2" * 64,
        now=lambda: datetime(2025, 1, 1, tzinfo=UTC),
    ).body
    match = re.search(
        r"\[download\]\((http://127\.0\.0\.1:\d+/[^)]+)\) \(link valid until 2025-01-01 01:00 UTC\)", body
    )
    assert match is not None, body
    assert "X-Amz-Signature=" in match.group(1)
    stored = httpx.get(match.group(1), timeout=10, trust_env=False).content
    assert (
        stored[:1] == b"\x01" and zstandard.ZstdDecompressor().decompressobj().decompress(stored[1:]) == big
    )
    assert "tail -c +2 FILE" in body
    # The commands fetch the bundle from S3 first.
    assert f"flaketriage bundle pull {'2' * 64} --from {s3_url}" in body
    assert f"flaketriage bundle export {'2' * 64} repro && (cd repro && bash run.sh)" in body


def test_captured_text_is_inert_markdown(store: LocalStore) -> None:
    hostile = "@octocat <img src=x> [x](javascript:alert(1)) | pipe `tick` \\[esc"
    manifest = issue_manifest(store, message=hostile, detail=hostile)
    draft_ = render_issue(store, manifest, "1" * 64, deterministic(), findings=[hostile])
    body = draft_.body
    assert (
        "| Message | @&#8203;octocat &lt;img src=x&gt; \\[x\\](javascript:alert(1)) "
        "\\| pipe \\`tick\\` \\\\\\[esc |" in body
    )
    assert "- @&#8203;octocat &lt;img src=x&gt;" in body
    assert "@octocat" not in draft_.title or "@\u200boctocat" in draft_.title
    assert draft_.evidence.startswith("**deterministic**: reproduced in 5 of 5 replays")
