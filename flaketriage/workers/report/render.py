"""Render a triaged failure as an issue draft: title, labels and a Markdown body with the evidence.

The body is written for the person who has to fix the failure: the verdict and its numbers first,
then the failure, where it ran, the source, the smallest reproduction found, its data itself (inline
when small, else links or store keys) and the commands to run it. Sections are plain Markdown so
every sink (files, GitHub) shows them the same way.

Captured text (messages, paths, output) is hostile until shown otherwise: it goes into code spans
and fences that its own backticks cannot close, or is escaped (HTML, links, table pipes), and an
``@`` in it never mentions anyone.
"""

from __future__ import annotations

import re
import shlex
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from flaketriage.bundle.io import describe_failure
from flaketriage.bundle.manifest import DataInput, Manifest
from flaketriage.errors import FlaketriageError
from flaketriage.failure.runner_results import is_test_runner
from flaketriage.settings import DEFAULT_OUTPUT_TAIL_LINES
from flaketriage.store import Store
from flaketriage.store.registry import local_path
from flaketriage.text.markdown import code_span, fenced, inert, unmention
from flaketriage.text.os_strings import shell_join
from flaketriage.text.titles import clip
from flaketriage.workers.cost import TriageCost
from flaketriage.workers.polluters import PolluterSearch, repeat_base
from flaketriage.workers.report.base import IssueDraft
from flaketriage.workers.samplers import summary_lines
from flaketriage.workers.verdict import VerdictResult

if TYPE_CHECKING:  # triage renders issues with this module: a runtime import would be a cycle
    from flaketriage.workers.triage import TriageResult

TITLE_PREFIX = "[flaketriage] "
MAX_TITLE = 120
MAX_TRACEBACK_LINES = 80
ENVIRONMENT_LABEL = "suspected-environment"
INLINE_DATA_BYTES = 4096
"""How much of the reproduction's data an issue shows inline (all inputs together): a few KB, the
size of a minimized CSV or JSONL, small beside GitHub's 65,536-character body."""
EXCERPT_SOURCE_BYTES = 1 << 20
"""A larger input gets no excerpt (only its link or key): the excerpt is read whole and verified."""
LINK_EXPIRY_S = 7 * 86400
"""How long presigned links in an issue work when the store names no expiry of its own: seven days,
the longest S3 signs for (an `S3Store` uses ``FLAKETRIAGE_S3_PRESIGN_EXPIRY_S``)."""
MAX_CELL = 300
MAX_LINE = 1000
MAX_NAMES = 50

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
    "environment": "could not be replayed: no replay could run in the bundle's environment",
    "order_dependent": "passes alone and fails only after certain other tests ran first in the same process",
    "environment_specific": "reproduces on some runners and never on others: on the one it was captured on "
    "(or hardware like it), or only away from it",
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
    order: PolluterSearch | None = None,
    tail_lines: int = DEFAULT_OUTPUT_TAIL_LINES,
    key: str | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    runners: Sequence[str] = (),
    hang: str | None = None,
    telemetry: Mapping[str, Any] | None = None,
    cost: TriageCost | None = None,
    occurrences: int | None = None,
) -> IssueDraft:
    """The issue for `manifest`'s failure after triage; logs are read from `store`.

    `store_location` is where people fetch the bundle from (default: a local store's path, else its URL);
    `findings` are extra observations (e.g. different failures seen during replay);
    `environment_specific` marks a failure that reproduces only on the original runner or hardware;
    `polluters` are the earlier tests an order-dependent test fails after (or, when `order` is a
    search for state-setters, the tests it needs to pass); `tail_lines`
    (``FLAKETRIAGE_OUTPUT_TAIL_LINES``) is how many of the last lines of stderr the issue shows;
    `key` is the draft's idempotency key (the triage that reports it); `now` dates presigned links;
    `runners` says what the replays did on each runner (`Attribution.lines`); `hang` is the stacks
    dumped from a replay that hung; `telemetry` a telemetry run's summary (`TelemetryRun`); `cost`
    what the triage's replays cost (`flaketriage.workers.cost`); `occurrences` the times the
    service's case saw the failure (`IssueDraft.occurrences`).
    """
    kind = str(verdict.verdict)
    labels = ["flaketriage", kind]
    if environment_specific:
        labels.append(ENVIRONMENT_LABEL)
    location = store_location or _address(store)
    sections = [
        _summary(manifest, bundle_id, verdict, environment_specific, runners, order),
        _order(manifest, polluters, order),
        _failure(store, manifest, tail_lines),
        _replay_hang(hang, manifest),
        _findings(findings),
        _telemetry(telemetry),
        triage_cost(cost),
        _environment(manifest),
        _source(manifest),
        _reproduction(bundle_id, minimal, minimal_bundle_id),
        _artifacts(store, minimal or manifest, minimal_bundle_id or bundle_id, location, now),
        _fetch(bundle_id, minimal_bundle_id, location),
    ]
    return IssueDraft(
        fingerprint=manifest.failure.fingerprint,
        title=issue_title(manifest, kind),
        body="\n\n".join(s for s in sections if s) + "\n",
        labels=tuple(labels),
        bundle_id=bundle_id,
        minimal_bundle_id=minimal_bundle_id,
        verdict=kind,
        key=key,
        evidence=evidence_line(verdict),
        occurrences=occurrences,
    )


# -- title ----------------------------------------------------------------------------------------
def issue_title(manifest: Manifest, verdict: str | None = None) -> str:
    """``[flaketriage] <test or job>: <what failed> (<verdict>)``, at most 120 characters; an ``@``
    in it mentions no one. The test is its node id, the job the file of the innermost frame of the
    user's code, else the command."""
    f = manifest.failure
    what = _one_line(describe_failure(manifest))
    if f.test_id:
        where = f.test_id
    elif f.exception_type and (frame := _user_frame(f.traceback)):
        where = PurePosixPath(frame.replace("\\", "/")).name
    else:
        where = shell_join(manifest.command.argv)
    suffix = f" ({verdict})" if verdict else ""
    room = MAX_TITLE - len(TITLE_PREFIX) - len(suffix)
    where = _clip(_one_line(where), max(20, room // 2))
    head = f"{where}: " if where else ""
    return unmention(TITLE_PREFIX + head + _clip(what, room - len(head)) + suffix, "\u200b")


def _user_frame(traceback: str | None) -> str | None:
    """The file of the innermost traceback frame outside installed libraries (else the innermost)."""
    paths = [m.group(1) for m in _FRAME_RE.finditer(traceback or "")]
    own = [path for path in paths if not any(part in path for part in _LIBRARY_PARTS)]
    return (own or paths or [None])[-1]


def _one_line(text: str) -> str:
    first = next((line for line in text.splitlines() if line.strip()), "")
    return " ".join(first.split())


def _clip(text: str, limit: int) -> str:
    return clip(text, limit)  # at a word: the body shows the whole


# -- the reply ------------------------------------------------------------------------------------
def render_comment(
    result: TriageResult, manifest: Manifest | None = None, *, quarantined: bool = False
) -> str:
    """The reply on the pull request or issue that asked for a triage: the verdict and its numbers,
    what was found (the polluters; the rows and arguments minimization kept; the runners), what was
    filed, and the command that reproduces it. `manifest` (the triaged bundle's) names the test and
    its command; `quarantined` says an order-dependent test's quarantine entry was written."""
    v = result.verdict
    kind = str(v.verdict)
    test = manifest.failure.test_id if manifest is not None else None
    subject = (
        f"{_code(test)} (bundle `{result.bundle_id[:12]}`)" if test else f"bundle `{result.bundle_id[:12]}`"
    )
    order = result.polluter_search if result.polluters else None
    meaning = order.cause() if order is not None else _VERDICT_MEANING.get(kind, kind)
    lines = [
        f"**flaketriage**: `{kind}` for {subject}: it {inert(meaning)}.",
        f"Evidence: {_counts(v, setters=order is not None and order.kind == 'setters')}.",
    ]
    lines += _reply_findings(result, manifest, order, quarantined)
    for finding in result.findings:
        label = "environment" if finding.kind == "environment" else "different failure"
        lines.append(f"- {label} ({finding.count}×): {inert(finding.summary)}")
    if result.report:
        lines.append(f"Report ({result.report.kind}): {inert(result.report.location)}")
    return "\n\n".join(lines)  # captured text is inert or in code, where nothing mentions anyone


def render_lift(result: TriageResult) -> str:
    """The comment that closes an issue when isolated reruns show the failure fixed."""
    v = result.verdict
    return (
        f"**Fixed**: the quarantine is lifted. Isolated reruns of the branch as it is now no longer "
        f"reproduce this failure: {evidence_line(v)}\n\n"
        f"Bundle `{result.bundle_id[:12]}`. flaketriage closes this issue; it is reopened if the "
        "failure comes back."
    )


def render_resolved(test_id: str, branch: str, passes: int) -> str:
    """The comment that closes a deterministic failure's issue when CI shows its test passing again."""
    return (
        f"**Fixed**: {code_span(test_id)} passed {passes} times in a row on {code_span(branch)} since "
        "this failure was last seen, and the sequential test says it no longer reproduces (the test "
        "that lifts a quarantine). flaketriage closes this issue; it is reopened if the failure comes back."
    )


def _flaky_filed(result: TriageResult, manifest: Manifest | None) -> str:
    """What a flaky verdict's reply says was filed. A failure with no test identity (a script, not a
    test run) has nothing CI can skip: it is marked flaky, with an issue, never said to be skipped."""
    quarantined = result.report is not None and result.report.kind == "quarantine"
    untested = (
        manifest is not None
        and manifest.failure.test_id is None
        and manifest.failure.kind != "test"
        and not is_test_runner(manifest.command.argv)
    )
    if quarantined and untested:
        return (
            "**Marked flaky**: it names no test, so nothing in CI skips it; its quarantine entry and "
            "flaky issue keep the evidence, and are lifted and closed when isolated reruns show it fixed."
        )
    if quarantined:
        return (
            "**Quarantined**: it no longer fails builds; the quarantine is lifted when isolated reruns "
            "show it fixed."
        )
    return "Not quarantined (no quarantine list is configured here)."


def _reply_findings(
    result: TriageResult, manifest: Manifest | None, order: PolluterSearch | None, quarantined: bool
) -> list[str]:
    """What the reply says the verdict found and did, with the command that shows it."""
    kind = str(result.verdict.verdict)
    bundle = result.bundle_id
    if kind == "order_dependent":
        return _reply_order(result, manifest, order, quarantined)
    if kind == "flaky":
        return [_flaky_filed(result, manifest), "Replay it:", fenced(f"flaketriage triage {bundle}", "bash")]
    if kind == "deterministic":
        return [*_reply_minimized(result), "Reproduce it:", fenced(_repro_commands(result, manifest), "bash")]
    if kind == "environment_specific":
        runners = result.attribution.lines() if result.attribution is not None else []
        shown = [f"- {inert(_clip(line, MAX_LINE))}" for line in runners]
        return [
            "It reproduces only on the original runner or hardware (or only away from it): look at the "
            "machines, drivers and GPUs before the code.",
            *(["Replays by runner:", "\n".join(shown)] if shown else []),
            "Reproduce it (on a runner like the one it failed on):",
            fenced(_repro_commands(result, manifest), "bash"),
        ]
    if kind == "environment":
        return [
            "Nothing was decided or filed; the reason is below. Fix the environment (or set "
            "`FLAKETRIAGE_ENVIRONMENT=worker`) and triage it again:",
            fenced(f"flaketriage triage {bundle}", "bash"),
        ]
    if kind == "not_reproduced":
        return [
            f"Nothing was filed: it passed every replay, so its rate is at most "
            f"{_percent(result.verdict.rate.high)} (95%). A longer telemetry run is the next step:",
            fenced(f"flaketriage telemetry {bundle}", "bash"),
        ]
    return ["Replay it:", fenced(f"flaketriage triage {bundle}", "bash")]


def _reply_order(
    result: TriageResult, manifest: Manifest | None, order: PolluterSearch | None, quarantined: bool
) -> list[str]:
    if order is None:
        return ["The tests it needs to run after were not confirmed, so none is named."]
    victim = (manifest.failure.test_id if manifest is not None else None) or "TEST"
    if order.itself and order.kind == "polluters":
        found = ["It fails when run twice in one process: its first run leaves state behind."]
    else:
        what = "State-setters (it passes only after them)" if order.kind == "setters" else "Polluters"
        found = [f"{what}:", "\n".join(f"- {_code(p)}" for p in order.polluters)]
    found += [
        "Reproduce it in order:" if order.kind == "polluters" else "It passes with them first, in order:",
        fenced(order_command(victim, order), "bash"),
    ]
    if quarantined:
        found.append(
            "**Quarantined** with its polluters named: it no longer fails builds until it is fixed "
            "(`FLAKETRIAGE_QUARANTINE_ORDER_DEPENDENT=false` turns this off)."
        )
    return found


def _reply_minimized(result: TriageResult) -> list[str]:
    m = result.minimized
    if m is None:
        return [f"Not minimized ({inert(result.minimize_error)})."] if result.minimize_error else []
    kept = [f"- {_code(path)}: kept {k} of {n}" for path, (k, n) in sorted(m.data.items())]
    kept += [f"- {_code(flag)}: {_code(a)} → {_code(b)}" for flag, (a, b) in sorted(m.args.items())]
    if not kept:
        return [f"Minimal bundle `{m.bundle_id[:12]}`: minimization found nothing to remove."]
    return [f"Minimal bundle `{m.bundle_id[:12]}` kept only what the failure needs:", "\n".join(kept)]


def _repro_commands(result: TriageResult, manifest: Manifest | None) -> str:
    repro = result.minimized.bundle_id if result.minimized is not None else result.bundle_id
    commands = [f"flaketriage bundle export {repro} repro && cd repro && bash run.sh"]
    if manifest is not None:
        commands.append(f"# or, in a checkout of the commit: {shell_join(manifest.command.argv)}")
    return "\n".join(commands)


# -- sections -------------------------------------------------------------------------------------
def _percent(value: float) -> str:
    return f"{100 * value:.1f}%"


def evidence_line(verdict: VerdictResult) -> str:
    """The verdict and its numbers in one Markdown line: what a tracker comments on a recurrence."""
    return f"**{verdict.verdict}**: {_counts(verdict, polluters='the polluters named in the issue')}."


def _counts(verdict: VerdictResult, polluters: str = "the polluters below", *, setters: bool = False) -> str:
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
        decided = (
            "the state-setters below make it pass on every confirmation run"
            if setters
            else f"{polluters} make it fail on every confirmation run"
        )
    return (
        f"{counts}; reproduction rate {_percent(rate.estimate)} "
        f"(95% interval {_percent(rate.low)}–{_percent(rate.high)}); {decided}"
    )


def _summary(
    manifest: Manifest,
    bundle_id: str,
    verdict: VerdictResult,
    environment_specific: bool,
    runners: Sequence[str] = (),
    order: PolluterSearch | None = None,
) -> str:
    kind = str(verdict.verdict)
    setters = order is not None and order.kind == "setters"
    meaning = _VERDICT_MEANING.get(kind, kind)
    if kind == "order_dependent" and order is not None:
        meaning = order.cause()
    lines = [
        f"**Verdict: {kind}**: this failure {meaning}.",
        "",
        f"Evidence: {_counts(verdict, setters=setters)}.",
    ]
    if environment_specific:
        lines += [
            "",
            "**Suspected environment-specific**: it reproduces only on the original runner or hardware"
            " (or only away from it): look at the machines, drivers and GPUs before the code.",
        ]
    if runners:
        lines += ["", "Replays by runner:", "", *(f"- {inert(_clip(line, MAX_LINE))}" for line in runners)]
    f = manifest.failure
    lines += [
        "",
        f"- Fingerprint: `{f.fingerprint}`",
        f"- Signature: {_inline_or_block(f.signature)}",
        f"- Bundle: `{bundle_id}`",
    ]
    return "\n".join(lines)


def _order(manifest: Manifest, polluters: Sequence[str], order: PolluterSearch | None = None) -> str:
    if not polluters:
        return ""
    victim = manifest.failure.test_id or "the test"
    listed = "\n".join(f"- {_code(p)}" for p in polluters)
    if order is not None and order.kind == "setters":
        return "\n".join(
            [
                "## Order dependence (brittle test)",
                "",
                f"{_code(victim)} fails when it runs alone and passes once these tests ran first in the same "
                "process: it depends on state they set up (a module global, a file, an environment "
                "variable) and should set it up itself:",
                "",
                listed,
                "",
                "It passes with these tests first, in this order (and fails without them):",
                "",
                fenced(order_command(victim, order, polluters), "bash"),
            ]
        )
    if order is not None and order.itself:
        return "\n".join(
            [
                "## Order dependence (non-idempotent test)",
                "",
                f"{_code(victim)} fails when it runs twice in one process: its first run leaves state "
                "behind (a module global, a file, an environment variable) that its second run trips on.",
                "",
                "Reproduce it by running it twice (with pytest-repeat installed):",
                "",
                fenced(order_command(victim, order, polluters), "bash"),
            ]
        )
    return "\n".join(
        [
            "## Order dependence",
            "",
            f"{_code(victim)} passes when it runs alone and fails after these tests ran first in the same "
            "process (they leave state behind: a module global, a file, an environment variable):",
            "",
            listed,
            "",
            "Reproduce it with exactly these tests, in this order:",
            "",
            fenced(order_command(victim, order, polluters), "bash"),
        ]
    )


def order_command(victim: str, order: PolluterSearch | None, polluters: Sequence[str] | None = None) -> str:
    """The command that shows an order-dependent test's cause, shell-quoted: the polluters (or
    state-setters) then the victim, in that order with pytest-randomly off, or for a test that fails
    when run twice, the test twice (pytest-repeat). `polluters` default to the search's."""
    base = ["python", "-m", "pytest", "-p", "no:randomly"]
    if order is not None and order.itself and order.kind == "polluters":
        return shlex.join([*base, "--count", "2", repeat_base(victim)])
    tests = list(order.polluters if polluters is None and order is not None else polluters or ())
    return shlex.join([*base, *tests, victim])


def _failure(store: Store, manifest: Manifest, tail_lines: int) -> str:
    f = manifest.failure
    rows = [("Kind", f.kind), ("Test", f.test_id), ("Exception", f.exception_type), ("Message", f.message)]
    rows += [("Exit code", None if f.exit_code is None else str(f.exit_code)), ("Signal", f.signal)]
    rows += [("Detail", f.detail), ("Duration", f"{f.duration_s:.1f} s" if f.duration_s else None)]
    rows += [("Command", shell_join(manifest.command.argv))]
    parts = ["## Failure", "", markdown_table(rows)]
    if f.message and (len(" ".join(f.message.split())) > MAX_CELL or "\n" in f.message.strip()):
        # The table's cell is one line, cut at a word; the message itself, whole, is here.
        whole = "\n".join(_clip_line(line) for line in f.message.splitlines())
        parts += ["", "Message:", "", fenced(whole, "text")]
    if f.traceback:
        lines = [_clip_line(line) for line in f.traceback.rstrip().splitlines()]
        if len(lines) > MAX_TRACEBACK_LINES:
            dropped = len(lines) - MAX_TRACEBACK_LINES
            lines = [
                f"... ({dropped} earlier lines left out; the bundle has them all)",
                *lines[-MAX_TRACEBACK_LINES:],
            ]
        if f.kind == "timeout":  # the stacks dumped before it was killed (flaketriage.process.hangs)
            parts += ["", "Where it hung:", "", fenced("\n".join(lines), "text")]
        else:
            parts += ["", "Traceback:", "", fenced("\n".join(lines), "pytb")]
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
    lines = [_clip_line(line) for line in text.rstrip().splitlines()[-tail_lines:]]
    return fenced("\n".join(lines), "text") if lines else None


def _replay_hang(hang: str | None, manifest: Manifest) -> str | None:
    if not hang or hang == manifest.failure.traceback:
        return None
    lines = [_clip_line(line) for line in hang.rstrip().splitlines()][-MAX_TRACEBACK_LINES:]
    return "\n".join(["## Where the replays hung", "", fenced("\n".join(lines), "text")])


def _telemetry(telemetry: Mapping[str, Any] | None) -> str | None:
    if not telemetry:
        return None
    shown = (inert(_clip(line, MAX_LINE)) for line in summary_lines(telemetry))
    return "\n".join(["## Telemetry run", "", *(f"- {line}" for line in shown)])


def triage_cost(cost: TriageCost | None) -> str | None:
    """The issue's section on what the triage cost: the totals, then a row per phase that ran."""
    if cost is None or not cost.runs:
        return None
    rows = [
        f"| {name} | {p.runs} | {p.cpu_s:.1f} | {p.gpu_s:.1f} | {p.wall_s:.1f} |"
        for name, p in cost.phases.items()
        if p.runs
    ]
    table = ["| phase | runs | CPU s | GPU s | wall s |", "| --- | --- | --- | --- | --- |", *rows]
    return "\n".join(["## What the triage cost", "", cost.line(), "", *table])


def _findings(findings: Sequence[str]) -> str | None:
    if not findings:
        return None
    shown = (inert(_clip(_one_line(item), MAX_LINE)) for item in findings)
    return "\n".join(["## Other findings", "", *(f"- {item}" for item in shown)])


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
        url = prov.run_url
        safe = re.fullmatch(r"https?://[^\s()<>\[\]`\\]+", url) is not None
        rows.append(("CI run", Markdown(f"[{url}]({url})") if safe else url))
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
        fenced(
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
        lines.append(f"- {_code(path)}: kept {kept} of {of} {units.get(path, 'items')}")
    for flag, (before, after) in sorted(m.args.items()):
        lines.append(f"- {_code(flag)}: {_code(before)} → {_code(after)}")
    lines += ["", f"Minimized command: {_code(shell_join(minimal.command.argv))}"]
    if m.oracle_calls:
        lines[-1] += f" (found in {m.oracle_calls} replays)"
    return lines


def _fetch(bundle_id: str, minimal_bundle_id: str | None, location: str) -> str:
    ids = f"`{bundle_id}`" + (f" (minimized: `{minimal_bundle_id}`)" if minimal_bundle_id else "")
    repro_id = minimal_bundle_id or bundle_id
    commands = [f"export FLAKETRIAGE_STORE={shlex.quote(location)}", f"flaketriage bundle show {bundle_id}"]
    if not _is_local(location):
        commands = [
            "# copy the reproduction into the local store (./.flaketriage), then run it there",
            f"flaketriage bundle pull {repro_id} --from {shlex.quote(location)}",
            f"flaketriage bundle export {repro_id} repro && (cd repro && bash run.sh)",
            "# or look at the bundle where it is",
            *commands,
        ]
    return "\n".join(
        [
            "## Bundle",
            "",
            f"The bundle {ids} is in the store at {_code(location)}. Where that store is reachable:",
            "",
            fenced("\n".join(commands), "bash"),
        ]
    )


def _address(store: Store) -> str:
    """What commands name the store by: a local store's path, any other's URL (``s3://b/p``)."""
    return store.location if _is_local(store.url) else store.url


def _is_local(location: str) -> bool:
    try:
        return local_path(location) is not None
    except FlaketriageError:
        return False


# -- the reproduction's data ----------------------------------------------------------------------
_LANGS = {"csv": "csv", "jsonl": "json"}


def _artifacts(
    store: Store, manifest: Manifest, bundle_id: str, location: str, now: Callable[[], datetime]
) -> str | None:
    """The reproduction's data itself: inline when it is small text, else an excerpt plus a link
    (a presigned URL when the store signs them) or the store key, and the kept file names."""
    if not manifest.data:
        return None
    links = _Links(store, location, now)
    budget = [INLINE_DATA_BYTES]
    heading = "## Minimal data" if manifest.minimization else "## Data"
    parts = [heading, "", f"What the reproduction (bundle `{bundle_id}`) reads, as it is in the bundle:"]
    for data in manifest.data:
        parts += ["", *_data_input(store, data, links, budget)]
    if links.keyed:
        parts += [
            "",
            f"The objects named by key are in the store at {_code(location)}; "
            f"`flaketriage bundle pull {bundle_id} --from {location}` copies them all, "
            f"`flaketriage bundle export {bundle_id} repro` writes them out as files.",
        ]
    if links.linked:
        parts += [
            "",
            "A link downloads the object as the store keeps it: one tag byte, then the bytes (tag "
            "`00`) or their zstd compression (tag `01`): `tail -c +2 FILE`, piped to `zstd -d` for `01`.",
        ]
    return "\n".join(parts)


def _data_input(store: Store, data: DataInput, links: _Links, budget: list[int]) -> list[str]:
    unit = _ITEM_UNITS.get(data.format, "items")
    if data.format == "dir":
        shown = data.files[:MAX_NAMES]
        lines = [f"- {_code(str(data.path))}: a directory of {len(data.files)} {unit}:"]
        lines += [f"  - {_code(str(f.path))} ({_size(f.size)}): {links.line(f.sha256)}" for f in shown]
        if len(data.files) > len(shown):
            lines.append(f"  - and {len(data.files) - len(shown)} more (the bundle lists them all)")
        return lines
    blob = data.blob
    if blob is None:
        return [f"- {_code(str(data.path))} ({data.format}): no content recorded"]
    head = f"- {_code(str(data.path))} ({data.format}, {data.items} {unit}, {_size(blob.size)})"
    lang = _LANGS.get(data.format)
    text = _text_of(store, blob.sha256, blob.size) if lang and blob.size <= EXCERPT_SOURCE_BYTES else None
    if text is not None and len(text.encode()) <= budget[0]:
        budget[0] -= len(text.encode())
        return [head + ":", "", fenced(text.rstrip("\n"), lang or "")]
    lines = [head + f": {links.line(blob.sha256)}"]
    if text is not None and budget[0] > 200:
        excerpt, count = _excerpt(text, budget[0])
        budget[0] -= len(excerpt.encode())
        total = text.count("\n") + (0 if text.endswith("\n") else 1)
        lines += ["", f"  The first {count} of its {total} lines:", "", fenced(excerpt, lang or "")]
    return lines


def _text_of(store: Store, key: str, size: int) -> str | None:
    """The blob as text, or None when it is not UTF-8 text (or cannot be read)."""
    try:
        raw = store.get_bytes(key, max_size=size)
        text = raw.decode("utf-8")
    except (FlaketriageError, UnicodeDecodeError):
        return None
    return None if "\x00" in text else text


def _excerpt(text: str, limit: int) -> tuple[str, int]:
    """The first whole lines of `text` within `limit` bytes (at least one, clipped), and how many."""
    lines: list[str] = []
    used = 0
    for line in text.splitlines():
        line = _clip_line(line)
        cost = len(line.encode()) + 1
        if lines and used + cost > limit:
            break
        lines.append(line)
        used += cost
    return "\n".join(lines), len(lines)


class _Links:
    """Where people download an object: a presigned link when the store signs them (S3), else its key."""

    def __init__(self, store: Store, location: str, now: Callable[[], datetime]) -> None:
        # Duck-typed, so this module never imports a backend (store/s3.py needs boto3).
        sign: Any = getattr(store, "presigned_url", None)
        self._sign = sign if callable(sign) else None
        expiry = getattr(store, "presign_expiry_s", None)  # FLAKETRIAGE_S3_PRESIGN_EXPIRY_S
        self._expiry = int(expiry) if isinstance(expiry, int | float) and expiry > 0 else LINK_EXPIRY_S
        self._until = now() + timedelta(seconds=self._expiry)
        self.keyed = self.linked = False

    def line(self, key: str) -> str:
        if self._sign is not None:
            try:
                url = str(self._sign(key, self._expiry))
            except (FlaketriageError, OSError, ValueError):
                url = ""  # no link this time: the key below still finds it
            if re.fullmatch(r"https?://[^\s()<>\[\]`\\]+", url):
                self.linked = True
                return f"[download]({url}) (link valid until {self._until.strftime('%Y-%m-%d %H:%M UTC')})"
        self.keyed = True
        return f"store key `{key}`"


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} bytes"
    scaled = n / 1024
    for unit in ("KB", "MB"):
        if scaled < 1024:
            return f"{scaled:.1f} {unit}"
        scaled /= 1024
    return f"{scaled:.1f} GB"


# -- Markdown pieces ------------------------------------------------------------------------------
def _inline_or_block(text: str) -> str:
    if "\n" in text or "`" in text:
        return "\n\n" + fenced(text, "text")
    return f"`{text}`"


def _code(text: str) -> str:
    """A code span that survives backticks inside `text` (on one line)."""
    return code_span(" ".join(text.split()))


def _clip_line(line: str) -> str:
    if len(line) <= MAX_LINE:
        return line
    return f"{line[:MAX_LINE]}… ({len(line) - MAX_LINE} more characters; the bundle has them all)"


class Markdown(str):
    """A table value that is Markdown already (a link flaketriage built), shown as it is."""


def _cell(key: str, value: str) -> str:
    if isinstance(value, Markdown):
        return value.replace("|", "\\|")
    value = _clip(" ".join(value.split()), MAX_CELL)
    # Code (commands, names) goes in a code span, so Markdown leaves its characters alone.
    value = _code(value) if key in _CODE_ROWS else inert(value)
    return value.replace("|", "\\|")


def markdown_table(rows: Sequence[tuple[str, str | None]]) -> str:
    """A two-column Markdown table of the rows that have a value; code-like rows in code spans."""
    out = ["| | |", "| --- | --- |"]
    out += [f"| {key} | {_cell(key, value)} |" for key, value in rows if value]
    return "\n".join(out)
