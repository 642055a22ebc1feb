"""Render a triaged failure as an issue draft: title, labels and a Markdown body with the evidence.

The body is written for the person who has to fix the failure: the verdict and its numbers first,
then the failure, where it ran, the source, the smallest reproduction found and the commands to run
it. Sections are plain Markdown so every sink (files, GitHub) shows them the same way.
"""

from __future__ import annotations

import re
import shlex
from collections import Counter
from collections.abc import Sequence
from pathlib import PurePosixPath

from flaketriage.bundle import describe_failure
from flaketriage.errors import FlaketriageError
from flaketriage.manifest import Manifest
from flaketriage.os_strings import shell_join
from flaketriage.settings import DEFAULT_OUTPUT_TAIL_LINES
from flaketriage.store import Store
from flaketriage.workers.report.base import IssueDraft
from flaketriage.workers.verdict import VerdictResult

TITLE_PREFIX = "[flaketriage] "
MAX_TITLE = 120
MAX_TRACEBACK_LINES = 80
ENVIRONMENT_LABEL = "suspected-environment"

# Packages that most often explain a numeric or GPU failure, in the order the table lists them.
KEY_PACKAGES = (
    "torch", "torchvision", "torchaudio", "triton", "jax", "jaxlib", "tensorflow", "numpy", "scipy",
    "pandas", "scikit-learn", "transformers", "accelerate", "lightning", "pytorch-lightning", "pytest",
)  # fmt: skip

_VERDICT_MEANING = {
    "deterministic": "reproduces on every replay with the recorded seeds and deterministic settings",
    "flaky": "reproduces only some of the time under identical replays",
    "not_reproduced": "did not reproduce on replay",
    "different_failure": "replays fail, but not the way the original run did",
    "order_dependent": "passes alone and fails only after certain other tests ran first in the same process",
}
_ITEM_UNITS = {"csv": "rows", "jsonl": "lines", "npy": "entries", "dir": "files"}
_FRAME_RE = re.compile(r'File "([^"]+)", line (\d+)')
_CODE_ROWS = ("Command", "Exception", "Test", "Commit", "Working directory", "Fingerprint")
_LIBRARY_PARTS = ("site-packages", "dist-packages", "/lib/python", "<frozen", "<string>")


def render_issue(
    store: Store,
    manifest: Manifest,
    bundle_id: str,
    verdict: VerdictResult,
    *,
    minimal: Manifest | None = None,
    minimal_bundle_id: str | None = None,
    store_location: str | None = None,
    findings: Sequence[str] = (),
    environment_specific: bool = False,
    polluters: Sequence[str] = (),
    tail_lines: int = DEFAULT_OUTPUT_TAIL_LINES,
) -> IssueDraft:
    """The issue for `manifest`'s failure after triage; logs are read from `store`.

    `store_location` is where people fetch the bundle from (default: ``store.location``);
    `findings` are extra observations (e.g. different failures seen during replay);
    `environment_specific` marks a failure that reproduces only on the original runner or hardware;
    `polluters` are the earlier tests an order-dependent test fails after; `tail_lines`
    (``FLAKETRIAGE_OUTPUT_TAIL_LINES``) is how many of the last lines of stderr the issue shows.
    """
    kind = str(verdict.verdict)
    labels = ["flaketriage", kind]
    if environment_specific:
        labels.append(ENVIRONMENT_LABEL)
    sections = [
        _summary(manifest, bundle_id, verdict, environment_specific),
        _order(manifest, polluters),
        _failure(store, manifest, tail_lines),
        _findings(findings),
        _environment(manifest),
        _source(manifest),
        _reproduction(bundle_id, minimal, minimal_bundle_id),
        _fetch(bundle_id, minimal_bundle_id, store_location or store.location),
    ]
    return IssueDraft(
        fingerprint=manifest.failure.fingerprint,
        title=issue_title(manifest),
        body="\n\n".join(s for s in sections if s) + "\n",
        labels=tuple(labels),
        bundle_id=bundle_id,
        minimal_bundle_id=minimal_bundle_id,
        verdict=kind,
    )


# -- title ----------------------------------------------------------------------------------------
def issue_title(manifest: Manifest) -> str:
    """``[flaketriage] <what failed> in <where>``, at most 120 characters."""
    f = manifest.failure
    what = _one_line(describe_failure(manifest))
    if f.test_id:
        where = f.test_id
    elif f.exception_type and (frame := _user_frame(f.traceback)):
        where = PurePosixPath(frame.replace("\\", "/")).name
    else:
        where = shell_join(manifest.command.argv)
    room = MAX_TITLE - len(TITLE_PREFIX)
    where = _clip(_one_line(where), max(20, room // 2))
    suffix = f" in {where}" if where else ""
    return TITLE_PREFIX + _clip(what, room - len(suffix)) + suffix


def _user_frame(traceback: str | None) -> str | None:
    """The file of the innermost traceback frame outside installed libraries (else the innermost)."""
    paths = [m.group(1) for m in _FRAME_RE.finditer(traceback or "")]
    own = [path for path in paths if not any(part in path for part in _LIBRARY_PARTS)]
    return (own or paths or [None])[-1]


def _one_line(text: str) -> str:
    first = next((line for line in text.splitlines() if line.strip()), "")
    return " ".join(first.split())


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(0, limit - 1)].rstrip() + "…"


# -- sections -------------------------------------------------------------------------------------
def _percent(value: float) -> str:
    return f"{100 * value:.1f}%"


def _summary(manifest: Manifest, bundle_id: str, verdict: VerdictResult, environment_specific: bool) -> str:
    kind = str(verdict.verdict)
    others = []
    if verdict.passes:
        others.append(f"{verdict.passes} passed")
    if verdict.different:
        others.append(f"{verdict.different} failed differently")
    counts = f"reproduced in {verdict.reproductions} of {verdict.replays} replays"
    if others:
        counts += f" ({', '.join(others)})"
    rate = verdict.rate
    decided = (
        "decided by the sequential test"
        if verdict.decided
        else "**undecided**: the replays ran out before the test could decide; this is its best guess"
    )
    if kind == "order_dependent":
        counts = f"run alone, it {counts}"
        decided = "the polluters below make it fail on every confirmation run"
    lines = [
        f"**Verdict: {kind}**: this failure {_VERDICT_MEANING.get(kind, kind)}.",
        "",
        f"Evidence: {counts}; reproduction rate {_percent(rate.estimate)} "
        f"(95% interval {_percent(rate.low)}–{_percent(rate.high)}); {decided}.",
    ]
    if environment_specific:
        lines += [
            "",
            "**Suspected environment-specific**: it reproduces only on the original runner or hardware.",
        ]
    f = manifest.failure
    lines += [
        "",
        f"- Fingerprint: `{f.fingerprint}`",
        f"- Signature: {_inline_or_block(f.signature)}",
        f"- Bundle: `{bundle_id}`",
    ]
    return "\n".join(lines)


def _order(manifest: Manifest, polluters: Sequence[str]) -> str:
    if not polluters:
        return ""
    victim = manifest.failure.test_id or "the test"
    listed = "\n".join(f"- `{p}`" for p in polluters)
    return "\n".join(
        [
            "## Order dependence",
            "",
            f"`{victim}` passes when it runs alone and fails after these tests ran first in the same "
            "process (they leave state behind: a module global, a file, an environment variable):",
            "",
            listed,
            "",
            "Reproduce it with exactly these tests, in this order:",
            "",
            _fence(shlex.join(["python", "-m", "pytest", "-p", "no:randomly", *polluters, victim]), "bash"),
        ]
    )


def _failure(store: Store, manifest: Manifest, tail_lines: int) -> str:
    f = manifest.failure
    rows = [("Kind", f.kind), ("Test", f.test_id), ("Exception", f.exception_type), ("Message", f.message)]
    rows += [("Exit code", None if f.exit_code is None else str(f.exit_code)), ("Signal", f.signal)]
    rows += [("Detail", f.detail), ("Duration", f"{f.duration_s:.1f} s" if f.duration_s else None)]
    rows += [("Command", shell_join(manifest.command.argv))]
    parts = ["## Failure", "", markdown_table(rows)]
    if f.traceback:
        lines = f.traceback.rstrip().splitlines()
        if len(lines) > MAX_TRACEBACK_LINES:
            dropped = len(lines) - MAX_TRACEBACK_LINES
            lines = [
                f"... ({dropped} earlier lines left out; the bundle has them all)",
                *lines[-MAX_TRACEBACK_LINES:],
            ]
        parts += ["", "Traceback:", "", _fence("\n".join(lines), "pytb")]
    tail = _stderr_tail(store, manifest, tail_lines)
    if tail:
        parts += [
            "",
            f"<details><summary>Last {tail_lines} lines of stderr</summary>",
            "",
            tail,
            "",
            "</details>",
        ]
    return "\n".join(parts)


def _stderr_tail(store: Store, manifest: Manifest, tail_lines: int) -> str | None:
    ref = manifest.logs.get("stderr")
    if ref is None:
        return None
    try:
        text = store.get_bytes(ref.sha256, max_size=ref.size).decode("utf-8", "replace")
    except FlaketriageError as exc:
        # The issue is still worth filing without the log; say why it is missing.
        return f"_The stderr log could not be read: {exc}_"
    lines = text.rstrip().splitlines()[-tail_lines:]
    return _fence("\n".join(lines), "text") if lines else None


def _findings(findings: Sequence[str]) -> str | None:
    if not findings:
        return None
    return "\n".join(["## Other findings", "", *(f"- {_one_line(item) or item}" for item in findings)])


def _environment(manifest: Manifest) -> str:
    return "\n".join(["## Environment", "", markdown_table(environment_rows(manifest))])


def environment_rows(manifest: Manifest) -> list[tuple[str, str | None]]:
    """The environment table's rows (label, value or None): Python, packages, GPUs, CUDA, host, CI."""
    env, hw, prov = manifest.environment, manifest.hardware, manifest.provenance
    rows: list[tuple[str, str | None]] = [
        ("Python", f"{env.python} ({env.implementation})"),
        ("Platform", f"{env.platform} {env.machine}"),
    ]
    rows += [(name, version) for name, version in key_packages(env.packages)]
    if hw.gpus:
        rows.append(
            ("GPUs", ", ".join(f"{n} × {name}" for name, n in Counter(g.name for g in hw.gpus).items()))
        )
    cuda = " / ".join(
        f"{label} {value}"
        for label, value in (
            ("CUDA", hw.cuda_version),
            ("cuDNN", hw.cudnn_version),
            ("driver", hw.driver_version),
        )
        if value
    )
    rows += [("CUDA", cuda or None), ("CPU", _cpu(manifest)), ("Host", hw.host or prov.host)]
    if prov.ci_provider:
        ci = prov.ci_provider + "".join(
            f", {label} {value}" for label, value in (("job", prov.job), ("attempt", prov.attempt)) if value
        )
        if prov.runner:
            ci += f" on {prov.runner}"
        rows.append(("CI", ci))
    if prov.run_url:
        rows.append(("CI run", f"[{prov.run_url}]({prov.run_url})"))
    return rows


def _cpu(manifest: Manifest) -> str | None:
    hw = manifest.hardware
    if not hw.cpu_model and not hw.cpu_count:
        return None
    count = f"{hw.cpu_count} × " if hw.cpu_count else ""
    return f"{count}{hw.cpu_model or 'CPU'}"


def key_packages(packages: Sequence[str]) -> list[tuple[str, str]]:
    """The `KEY_PACKAGES` among ``name==version`` pins, in `KEY_PACKAGES` order."""
    found: dict[str, str] = {}
    for pin in packages:
        name, sep, version = pin.partition("==")
        if sep:
            found[re.sub(r"[-_.]+", "-", name.strip()).lower()] = version.strip()
    return [(name, found[name]) for name in KEY_PACKAGES if name in found]


def _source(manifest: Manifest) -> str:
    src = manifest.source
    if src.kind == "none":
        return "## Source\n\nNo source was recorded with this failure."
    rows: list[tuple[str, str | None]] = []
    if src.kind == "git":
        rows += [("Commit", src.commit), ("Branch", src.branch)]
        rows += [("Remote", src.remote)]
        diff = f"yes ({src.diff.size} bytes of `git diff`)" if src.diff else "no"
        rows += [("Uncommitted changes", diff), ("Untracked files", str(len(src.files)))]
    else:
        rows += [("Snapshot", f"{len(src.files)} files (no git repository)")]
    rows += [("Working directory", src.subdir)]
    if src.skipped:
        rows.append(("Left out (too large)", ", ".join(src.skipped)))
    left_out = manifest.excluded_files()
    if left_out:
        rows.append(("Left out (never captured)", "; ".join(f"{e.path}: {e.reason}" for e in left_out)))
    if src.masked:
        note = " (secrets replaced by [REDACTED]; replays run these copies, which may be why one fails)"
        rows.append(("Masked", ", ".join(src.masked) + note))
    return "\n".join(["## Source", "", markdown_table(rows)])


def _reproduction(bundle_id: str, minimal: Manifest | None, minimal_bundle_id: str | None) -> str:
    repro_id = minimal_bundle_id or bundle_id
    parts = ["## Minimal reproduction", ""]
    if minimal is None:
        parts.append("This failure was not minimized; the reproduction below is the full captured run.")
    else:
        parts += _minimization(minimal)
    parts += [
        "",
        "Export a self-contained reproduction (workspace, seeds, `run.sh`, Dockerfile, original logs) "
        "and run it without flaketriage, or replay and triage the bundle again:",
        "",
        _fence(
            f"flaketriage bundle export {repro_id} repro && cd repro && bash run.sh\n"
            f"flaketriage triage {bundle_id}",
            "bash",
        ),
    ]
    return "\n".join(parts)


def _minimization(minimal: Manifest) -> list[str]:
    m = minimal.minimization
    if m is None or (not m.data and not m.args):
        return ["Minimization found nothing to remove: every input and argument is needed."]
    units = {d.path: _ITEM_UNITS.get(d.format, "items") for d in minimal.data}
    lines = ["Minimization kept only what the failure needs:", ""]
    for path, (kept, of) in sorted(m.data.items()):
        lines.append(f"- `{path}`: kept {kept} of {of} {units.get(path, 'items')}")
    for flag, (before, after) in sorted(m.args.items()):
        lines.append(f"- `{flag}`: `{before}` → `{after}`")
    lines += ["", f"Minimized command: `{shell_join(minimal.command.argv)}`"]
    if m.oracle_calls:
        lines[-1] += f" (found in {m.oracle_calls} replays)"
    return lines


def _fetch(bundle_id: str, minimal_bundle_id: str | None, location: str) -> str:
    ids = f"`{bundle_id}`" + (f" (minimized: `{minimal_bundle_id}`)" if minimal_bundle_id else "")
    return "\n".join(
        [
            "## Bundle",
            "",
            f"The bundle {ids} is in the store at `{location}`. Where that store is reachable:",
            "",
            _fence(
                f"export FLAKETRIAGE_STORE={shlex.quote(location)}\nflaketriage bundle show {bundle_id}",
                "bash",
            ),
        ]
    )


# -- Markdown pieces ------------------------------------------------------------------------------
def _fence(text: str, lang: str = "") -> str:
    """A fenced code block that survives backticks inside `text`."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{text}\n{fence}"


def _inline_or_block(text: str) -> str:
    if "\n" in text or "`" in text:
        return "\n\n" + _fence(text, "text")
    return f"`{text}`"


def _cell(key: str, value: str) -> str:
    value = " ".join(value.split())
    # Code (commands, names) goes in a code span, so Markdown leaves its characters alone.
    value = f"`{value}`" if key in _CODE_ROWS and "`" not in value else value.replace("<", "&lt;")
    return value.replace("|", "\\|")


def markdown_table(rows: Sequence[tuple[str, str | None]]) -> str:
    """A two-column Markdown table of the rows that have a value; code-like rows in code spans."""
    out = ["| | |", "| --- | --- |"]
    out += [f"| {key} | {_cell(key, value)} |" for key, value in rows if value]
    return "\n".join(out)
