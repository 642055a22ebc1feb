"""``flaketriage capture`` and ``flaketriage triage``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from flaketriage.cli.console import (
    JsonOption,
    StoreOption,
    err,
    labelled,
    out,
    plain,
    progress_bar,
    settings_for,
    with_local_reports,
)
from flaketriage.errors import ConfigError
from flaketriage.text.printable import printable

if TYPE_CHECKING:
    from flaketriage.bundle.manifest import FailureCriteria

if TYPE_CHECKING:
    from flaketriage.workers.triage import TriageResult


def criteria_from_options(
    fail_patterns: list[str],
    metric: str | None,
    above: float | None,
    below: float | None,
    metrics_file: str | None,
) -> FailureCriteria:
    import re

    from flaketriage.bundle.manifest import FailureCriteria, MetricBound

    for pattern in fail_patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"--fail-pattern {pattern!r} is not a valid regular expression: {exc}") from exc
    metrics: tuple[MetricBound, ...] = ()
    if metric is not None:
        if above is None and below is None:
            raise ConfigError(f"--metric {metric} needs a bound: add --above X and/or --below X")
        metrics = (MetricBound(name=metric, above=above, below=below),)
    elif above is not None or below is not None:
        raise ConfigError("--above/--below need --metric NAME to say which metric they bound")
    return FailureCriteria(fail_patterns=tuple(fail_patterns), metrics=metrics, metrics_file=metrics_file)


def capture(
    command: Annotated[list[str], typer.Argument(help="The command to run, after `--`.", show_default=False)],
    store: StoreOption = None,
    as_json: JsonOption = False,
    data: Annotated[
        list[Path] | None,
        typer.Option(
            "--data",
            help="A reducible input (CSV, JSONL, .npy, directory).",
            readable=False,  # checked (and reported in one line) by the capture itself
        ),
    ] = None,
    fail_pattern: Annotated[
        list[str] | None, typer.Option("--fail-pattern", help="Output matching this regex is a failure.")
    ] = None,
    metric: Annotated[str | None, typer.Option(help="A metric read from `NAME=value` output lines.")] = None,
    above: Annotated[float | None, typer.Option(help="Fail when the metric goes above this.")] = None,
    below: Annotated[float | None, typer.Option(help="Fail when the metric goes below this.")] = None,
    metrics_file: Annotated[
        str | None, typer.Option(help="JSON / JSON Lines metrics file (cwd-relative).")
    ] = None,
    seed_env: Annotated[
        list[str] | None, typer.Option("--seed-env", help="Record this environment variable as a seed.")
    ] = None,
    snapshot: Annotated[bool, typer.Option(help="Snapshot the directory even inside git.")] = False,
    timeout: Annotated[float | None, typer.Option(help="Kill the command after this many seconds.")] = None,
) -> None:
    """Run COMMAND; when it fails, capture a bundle. Exits with COMMAND's exit code."""
    from flaketriage.capture.record import CaptureRequest, run_and_capture
    from flaketriage.capture.source import SourceLimits
    from flaketriage.process.child import check_timeout, shell_exit_code
    from flaketriage.store import open_store

    check_timeout(timeout, "--timeout")
    settings = settings_for(store)
    criteria = criteria_from_options(fail_pattern or [], metric, above, below, metrics_file)
    st = open_store(settings.store, shared=settings.store_shared, settings=settings)
    request = CaptureRequest(
        argv=command,
        cwd=Path.cwd(),
        limits=SourceLimits.from_settings(settings),
        criteria=criteria,
        data=data or [],
        seed_env=seed_env or [],
        snapshot=snapshot,
        timeout_s=timeout,
    )
    result = run_and_capture(st, request)
    code = shell_exit_code(result.process.exit_code)
    if result.failure is not None and code == 0:
        code = 1  # a pattern or metric failure (or an unreadable metrics file) must fail the CI step too
    failure = result.failure
    if failure is not None and failure.signature.startswith("metric|file|"):
        err.print(f"flaketriage: {printable(failure.detail or '')}", markup=False)
    if result.bundle_id:
        kind = failure.kind if failure else ""
        err.print(f"flaketriage: captured bundle {result.bundle_id} ({kind})")
    if result.error is not None:
        # The command ran: its status stands, and the user learns why nothing was captured.
        seen = f"failed ({failure.kind}, exit {code})" if failure is not None else f"exited {code}"
        err.print(
            f"[red]error:[/red] the command {seen}, but flaketriage could not record it: "
            f"{escape(printable(result.error))}; no bundle was written"
        )
    if as_json:
        sys.stdout.flush()
        print(
            json.dumps(
                {
                    "bundle": result.bundle_id,
                    "exit_code": code,
                    "fingerprint": result.failure.fingerprint if result.failure else None,
                    "error": result.error,
                }
            )
        )
    raise typer.Exit(code)


def triage(
    bundle: Annotated[str, typer.Argument(help="Bundle id or unique prefix.")],
    store: StoreOption = None,
    as_json: JsonOption = False,
    minimize: Annotated[
        bool, typer.Option(help="Reduce data and integer knobs of a reproducible failure.")
    ] = False,
    max_replays: Annotated[int | None, typer.Option(min=1, help="Upper bound on replays.")] = None,
    sandbox: Annotated[str | None, typer.Option(help="auto, bwrap, process or docker.")] = None,
    timeout: Annotated[float | None, typer.Option(help="Wall-clock limit per replay, seconds.")] = None,
    budget: Annotated[
        float | None,
        typer.Option(help="Most CPU+GPU seconds of replays (FLAKETRIAGE_TRIAGE_BUDGET_S); spent: undecided."),
    ] = None,
) -> None:
    """Replay a bundle until a verdict is certain; optionally minimize it; write the report."""
    from flaketriage.files.modes import FileModes
    from flaketriage.process.child import check_timeout
    from flaketriage.quarantine import EntryScope
    from flaketriage.store import open_store
    from flaketriage.workers.quarantine.file import Quarantine
    from flaketriage.workers.replay import ReplayContext
    from flaketriage.workers.report.backend import open_issue_sink
    from flaketriage.workers.sandbox import make_sandbox
    from flaketriage.workers.triage import triage as run_triage
    from flaketriage.workers.verdict import VerdictPolicy

    check_timeout(timeout, "--timeout")
    check_timeout(budget, "--budget")
    settings = with_local_reports(settings_for(store))
    if sandbox is not None:
        if sandbox not in ("auto", "bwrap", "process", "docker"):
            raise ConfigError(f"--sandbox {sandbox!r}: choose auto, bwrap, process or docker")
        settings = settings.model_copy(update={"sandbox": sandbox})
    st = open_store(settings.store, shared=settings.store_shared, settings=settings)
    sink = open_issue_sink(settings)  # GitHub when FLAKETRIAGE_GITHUB_REPO and credentials are set
    sink.check()  # a wrong token or repository fails now, not after the replays
    policy = VerdictPolicy(
        min_rate=settings.min_flaky_rate,
        max_rate=settings.max_flaky_rate,
        alpha=settings.alpha,
        max_replays=max_replays or settings.max_replays,
        flaky_rate_replays=settings.flaky_rate_replays,
    )
    replay_sandbox = make_sandbox(
        settings.sandbox, warn=lambda msg: err.print(f"warning: {msg}", markup=False), settings=settings
    )
    with progress_bar() as bar:
        task = bar.add_task("replaying", total=policy.max_replays)

        def progress(msg: str, done: int, total: int) -> None:
            msg = escape(printable(msg))  # the bar reads markup; a data path may hold brackets
            if total:
                bar.update(task, description=msg, completed=done)
            else:
                bar.update(task, description=msg)

        result = run_triage(
            st,
            bundle,
            sandbox=replay_sandbox,
            policy=policy,
            sink=sink,
            quarantine=Quarantine(
                settings.resolved_quarantine_file(),
                modes=FileModes.of(settings.store_shared),
                order_dependent=settings.quarantine_order_dependent,
                scope=EntryScope.from_settings(settings),
            ),
            context=ReplayContext.from_settings(settings),
            minimize=minimize,
            timeout_s=timeout,
            default_timeout_s=settings.replay_timeout_s,
            memory_mb=settings.replay_memory_mb,
            tail_lines=settings.output_tail_lines,
            progress=progress,
            budget_s=budget if budget is not None else settings.triage_budget_s,
        )
    data = result.to_json()
    if as_json:
        print(json.dumps(data))
        return
    if data["verdict"] == "environment":
        # Nothing ran: one line that says why (the runner lacks the bundle's Python or packages).
        reasons = [f.summary for f in result.findings if f.kind == "environment"] or ["cannot be had"]
        out.print(labelled("environment:", "bold", reasons[0]))
        return
    rate = data["failure_rate"]
    out.print(
        f"[bold]{_verdict_label(result)}[/bold]: reproduced {data['failures']} of {data['replays']} replays "
        f"(rate {rate['estimate']:.2f}, 95% interval {rate['low']:.2f}–{rate['high']:.2f})"
        + (" when run alone" if result.polluters else "")
        + ("" if data["decided"] or result.budget_spent else " — undecided at --max-replays")
    )
    if result.polluters:
        search = data["polluter_search"]
        out.print(plain(f"order-dependent: {result.order_cause}"))
        among = "other tests of the session" if search.get("kind") == "setters" else "preceding tests"
        out.print(
            f"  found among {search['preceding']} {among} in {search['replays']} replays "
            f"(confirmed {search['confirmations']} of {search['confirm_runs']})"
        )
    elif data["polluter_search"] and data["polluter_search"]["reproduced_in_order"]:
        search = data["polluter_search"]
        out.print(
            plain(
                (
                    "  it passed after the session's other tests, but the state-setters found "
                    if search.get("kind") == "setters"
                    else "  the original test order reproduced the failure, but the polluters found "
                )
                + f"({' '.join(search['polluters'])}) did not confirm "
                f"({search['confirmations']} of {search['confirm_runs']})"
            )
        )
    for finding in result.findings:
        what = "environment" if finding.kind == "environment" else "different failure"
        out.print(plain(f"  {what} ({finding.count}×): {finding.summary}"))
    environment = data.get("environment") or {}
    if environment.get("mode") == "bundle" and environment.get("digest"):
        how = f"built in {environment['build_s']:.1f} s" if environment.get("built") else "cached"
        built = f"{environment['python']}, {environment['packages']} packages, {how}"
        out.print(plain(f"  environment: the bundle's ({built})"))
    if result.hardware_difference:
        out.print(labelled("  note:", "yellow", result.hardware_difference))
    if result.minimized:
        kept = ", ".join(f"{p}: kept {v['kept']} of {v['of']}" for p, v in data["minimal"]["data"].items())
        args = ", ".join(f"{a} {v['from']}→{v['to']}" for a, v in data["minimal"]["args"].items())
        out.print(
            plain(
                f"minimal bundle {result.minimized.bundle_id[:12]}: {'; '.join(x for x in (kept, args) if x)}"
            )
        )
    if result.minimize_error:
        out.print(labelled("not minimized:", "yellow", result.minimize_error))
    if result.cost is not None:
        out.print(plain(f"  cost: {result.cost.line()}"))
    report = data["report"]
    if report["kind"] != "none":
        out.print(plain(f"report ({report['kind']}): {report['location']}"))


def _verdict_label(result: TriageResult) -> str:
    """The verdict, or for a triage its budget stopped, that it is undecided: its guess is no verdict."""
    v = result.verdict
    if result.budget_spent and not v.decided:
        return f"undecided (triage budget spent; best guess so far {v.verdict}, nothing reported)"
    return str(v.verdict)
