"""``flaketriage telemetry``: replay a failure longer while sampling the machine, then profile it."""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated

import typer
from rich.markup import escape

from flaketriage.cli.console import (
    JsonOption,
    StoreOption,
    err,
    out,
    plain,
    progress_bar,
    settings_for,
    with_local_reports,
)
from flaketriage.errors import ConfigError
from flaketriage.text.printable import printable


def telemetry(
    bundle: Annotated[str, typer.Argument(help="Bundle id or unique prefix.")],
    store: StoreOption = None,
    as_json: JsonOption = False,
    interval: Annotated[
        float | None,
        typer.Option(
            help="Seconds between samples (default: FLAKETRIAGE_TELEMETRY_INTERVAL_S).", show_default=False
        ),
    ] = None,
    factor: Annotated[
        float | None,
        typer.Option(
            min=1,
            help="Look for flakes this many times rarer than triage does (default: "
            "FLAKETRIAGE_TELEMETRY_REPLAYS_FACTOR).",
            show_default=False,
        ),
    ] = None,
    max_replays: Annotated[int | None, typer.Option(min=1, help="Upper bound on replays.")] = None,
    sandbox: Annotated[str | None, typer.Option(help="auto, bwrap, process or docker.")] = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            help="Wall-clock limit per replay, seconds (default: the usual limit × "
            "FLAKETRIAGE_TELEMETRY_TIMEOUT_FACTOR).",
            show_default=False,
        ),
    ] = None,
    profile: Annotated[bool, typer.Option(help="Run one more replay under a profiler.")] = True,
) -> None:
    """Replay a bundle (one that did not reproduce) longer, sampling CPU, memory and GPUs; profile it."""
    from flaketriage.bundle.io import load_manifest
    from flaketriage.files.modes import FileModes
    from flaketriage.process.child import check_timeout
    from flaketriage.quarantine import EntryScope
    from flaketriage.store import open_store
    from flaketriage.workers.quarantine.file import Quarantine
    from flaketriage.workers.replay import ReplayContext, Replayer
    from flaketriage.workers.report.backend import open_issue_sink
    from flaketriage.workers.samplers import summary_lines
    from flaketriage.workers.sandbox import make_sandbox
    from flaketriage.workers.telemetry import TelemetryRun, telemetry_policy
    from flaketriage.workers.triage import report
    from flaketriage.workers.verdict import VerdictPolicy

    check_timeout(timeout, "--timeout")
    check_timeout(interval, "--interval")
    settings = with_local_reports(settings_for(store))
    if sandbox is not None:
        if sandbox not in ("auto", "bwrap", "process", "docker"):
            raise ConfigError(f"--sandbox {sandbox!r}: choose auto, bwrap, process or docker")
        settings = settings.model_copy(update={"sandbox": sandbox})
    st = open_store(settings.store, shared=settings.store_shared, settings=settings)
    manifest = load_manifest(st, bundle)
    policy = telemetry_policy(
        VerdictPolicy(
            min_rate=settings.min_flaky_rate,
            max_rate=settings.max_flaky_rate,
            alpha=settings.alpha,
            max_replays=settings.max_replays,
            flaky_rate_replays=settings.flaky_rate_replays,
        ),
        factor or settings.telemetry_replays_factor,
    )
    if max_replays is not None:
        policy = dataclasses.replace(policy, max_replays=max_replays)
    limit = (
        timeout
        or (manifest.command.timeout_s or settings.replay_timeout_s) * settings.telemetry_timeout_factor
    )
    replay_sandbox = make_sandbox(
        settings.sandbox, warn=lambda msg: err.print(f"warning: {msg}", markup=False), settings=settings
    )
    with progress_bar() as bar:
        task = bar.add_task("replaying", total=policy.max_replays)

        def progress(msg: str, done: int, total: int) -> None:
            msg = escape(printable(msg))  # the bar reads markup
            if total:
                bar.update(task, description=msg, completed=done)
            else:
                bar.update(task, description=msg)

        with Replayer(
            st,
            manifest,
            replay_sandbox,
            context=ReplayContext.from_settings(settings),
            timeout_s=limit,
            memory_mb=settings.replay_memory_mb,
        ) as replayer:
            result = TelemetryRun(
                st,
                replayer,
                policy,
                interval_s=interval or settings.telemetry_interval_s,
                profile=profile,
                progress=progress,
            ).run()
    result.report = report(
        st,
        manifest,
        result,
        open_issue_sink(settings),
        Quarantine(
            settings.resolved_quarantine_file(),
            modes=FileModes.of(settings.store_shared),
            scope=EntryScope.from_settings(settings),
        ),
        tail_lines=settings.output_tail_lines,
    )
    data = result.to_json()
    if as_json:
        print(json.dumps(data))
        return
    rate = data["failure_rate"]
    out.print(
        f"[bold]{data['verdict']}[/bold]: reproduced {data['failures']} of {data['replays']} replays "
        f"(rate {rate['estimate']:.2f}, 95% interval {rate['low']:.2f}–{rate['high']:.2f}), "
        f"{limit:g} s per replay" + ("" if data["decided"] else " — undecided at --max-replays")
    )
    for line in summary_lines(result.telemetry or {}):
        out.print(plain(f"  {line}"))
    for finding in result.findings:
        out.print(plain(f"  different failure ({finding.count}×): {finding.summary}"))
    if data["report"]["kind"] != "none":
        out.print(plain(f"report ({data['report']['kind']}): {data['report']['location']}"))
