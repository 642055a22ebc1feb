"""``flaketriage cases``: the service's cases, listed and shown one by one with their evidence, read
from its API (``FLAKETRIAGE_SERVICE_URL``) or, without a service, from the embedded database."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from flaketriage.cli.case_sources import Case, CasesUnavailable, open_source
from flaketriage.cli.console import JsonOption, StoreOption, err, labelled, out, plain

LINE_UNLIMITED = 1_000_000
"""The width the list is laid out in when stdout is not a terminal: one case per line."""
DEFAULT_TIMEOUT_S = 10.0


app = typer.Typer(
    help="List the service's cases, newest first, or show one with its evidence.",
    invoke_without_command=True,
)

ServiceOption = Annotated[
    str | None,
    typer.Option(
        "--service",
        help="The service's base URL (default: FLAKETRIAGE_SERVICE_URL, else the origin of "
        "FLAKETRIAGE_NOTIFY_URL; neither: the embedded database).",
        show_default=False,
    ),
]
TimeoutOption = Annotated[float, typer.Option(min=0.1, help="Seconds to wait for the service.")]


@app.callback()
def list_command(
    ctx: typer.Context,
    status: Annotated[
        str | None,
        typer.Option(
            help="Only cases with this status (queued, triaging, decided, reported, ...).", show_default=False
        ),
    ] = None,
    verdict: Annotated[
        str | None,
        typer.Option(help="Only cases with this verdict (flaky, deterministic, ...).", show_default=False),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="Most cases to list.")] = 100,
    service: ServiceOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """List cases, newest first (`show ID`: one case with its evidence). Exit 1 when the service or
    the database cannot answer (down, a refused token, a bad filter), 2 for a bad option or setting."""
    if ctx.invoked_subcommand is not None:
        ctx.obj = (service, timeout, store)  # `cases --service URL show 3` works too
        return
    source = open_source(service, store, timeout)
    cases = _answered(lambda: source.list(status=status, verdict=verdict, limit=limit))
    if as_json:
        out.print_json(json.dumps(cases), ensure_ascii=True)
        return
    if not cases:
        filters = ", ".join(f"{k} {v}" for k, v in (("status", status), ("verdict", verdict)) if v)
        err.print(plain(f"no cases{f' with {filters}' if filters else ''} at {source.where}"))
        return
    _print_list(cases)


@app.command("show")
def show_command(
    ctx: typer.Context,
    case_id: Annotated[
        int, typer.Argument(metavar="ID", help="The case's id (`flaketriage cases` lists them).")
    ],
    service: ServiceOption = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            min=0.1,
            help=f"Seconds to wait for the service (default {DEFAULT_TIMEOUT_S:g}).",
            show_default=False,
        ),
    ] = None,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show one case: verdict, failure rate, polluters, findings, replays, progress while work on it
    runs, the cases of the same CI run, report link and cost."""
    outer = ctx.obj if isinstance(ctx.obj, tuple) else (None, DEFAULT_TIMEOUT_S, None)
    source = open_source(service or outer[0], store or outer[2], timeout or outer[1])
    case = _answered(lambda: source.get(case_id))
    if as_json:
        out.print_json(json.dumps(case), ensure_ascii=True)
        return
    _print_case(case)


def _answered(read: Any) -> Any:
    """`read()`, its `CasesUnavailable` said as one ``error:`` line with exit status 1."""
    try:
        return read()
    except CasesUnavailable as exc:
        err.print(labelled("error:", "red", exc))
        raise typer.Exit(1) from None


def _when(text: str | None) -> str:
    if not text:
        return "-"
    try:
        return datetime.fromisoformat(text).strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        return text


def _print_list(cases: list[Case]) -> None:
    table = Table(box=None, pad_edge=False)
    for col in ("id", "status", "verdict", "kind", "title", "occurrences", "last seen"):
        whole = col != "title"  # ids, words and times never wrap; a title folds on a terminal
        table.add_column(
            col,
            overflow="fold",
            no_wrap=whole,
            justify="right" if col in ("id", "occurrences") else "left",
            min_width=19 if col == "last seen" else None,
        )
    for c in cases:
        title = str(c.get("title") or "")
        if c.get("storm_of"):
            title += f" (with case {c['storm_of']})"
        table.add_row(
            str(c.get("id")),
            plain(c.get("status") or "-"),
            plain(c.get("verdict") or "-"),
            plain(c.get("kind") or "-"),
            plain(title),
            str(c.get("occurrences", "-")),
            _when(c.get("last_seen")),
        )
    # Piped (to grep, cut, a file), each case is one line however long its title: nothing wraps.
    (out if out.is_terminal else Console(width=LINE_UNLIMITED, highlight=False)).print(table)


def case_rows(case: Case) -> list[tuple[str, str]]:
    """`flaketriage cases show`'s lines, as (label, text): the case, then its evidence."""
    evidence: dict[str, Any] = case.get("evidence") or {}
    rows = [
        ("case", f"{case.get('id')} {case.get('title') or ''}".rstrip()),
        ("status", str(case.get("status") or "-")),
        ("verdict", _verdict(case, evidence)),
        ("kind", str(case.get("kind") or "-")),
    ]
    for label, key in (("test", "test_id"), ("job", "job"), ("repository", "repository")):
        if case.get(key):
            rows.append((label, str(case[key])))
    rows.append(("fingerprint", str(case.get("fingerprint") or "-")))
    count = case.get("occurrences", 0)
    seen = f"{count} time{'' if count == 1 else 's'}, first {_when(case.get('first_seen'))}"
    rows.append(("seen", f"{seen}, last {_when(case.get('last_seen'))}"))
    if case.get("storm_of"):
        rows.append(("storm of", f"case {case['storm_of']} (the same cause; its triage stands for this one)"))
    progress = case.get("progress")
    if isinstance(progress, dict):
        rows.append(("progress", _progress_line(progress)))
    rows += _evidence_rows(evidence)
    rows += _replay_rows(case.get("triage_runs") or [])
    rows += [
        ("linked", _link_line(link)) for link in case.get("linked_cases") or [] if isinstance(link, dict)
    ]
    if case.get("report_url"):
        rows.append(("report", f"{case.get('report_kind') or 'report'}: {case['report_url']}"))
    cost = case.get("cost")
    if cost:
        rows.append(("cost", _cost_line(cost)))
    if case.get("bundles"):
        rows.append(("bundles", " ".join(str(b)[:12] for b in case["bundles"])))
    if case.get("error"):
        rows.append(("error", str(case["error"])))
    return rows


def _verdict(case: Case, evidence: dict[str, Any]) -> str:
    verdict = case.get("verdict")
    if verdict:
        return str(verdict)
    if evidence.get("verdict"):
        return f"undecided (best guess so far {evidence['verdict']})"
    return "none yet"


def _evidence_rows(evidence: dict[str, Any]) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    rate = evidence.get("failure_rate")
    if isinstance(rate, dict) and "replays" in evidence:
        # Evidence of another version's shape is left out here (--json shows it whole).
        with contextlib.suppress(KeyError, TypeError, ValueError):
            rows.append(
                (
                    "rate",
                    f"reproduced {evidence.get('failures', 0)} of {evidence['replays']} replays "
                    f"(rate {rate['estimate']:.2f}, 95% interval {rate['low']:.2f}–{rate['high']:.2f})",
                )
            )
    if evidence.get("polluters"):
        rows.append(("polluters", " ".join(str(p) for p in evidence["polluters"])))
    for finding in evidence.get("findings") or []:
        if isinstance(finding, dict):
            what = "environment" if finding.get("kind") == "environment" else "different failure"
            rows.append(("finding", f"{what} ({finding.get('count', '?')}×): {finding.get('summary', '')}"))
    if evidence.get("minimal_bundle"):
        rows.append(("minimal", f"bundle {str(evidence['minimal_bundle'])[:12]}"))
    if evidence.get("hardware_difference"):
        rows.append(("note", str(evidence["hardware_difference"])))
    return rows


def _replay_rows(runs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    replays = [r for run in runs for r in (run.get("replays") or [])]
    if not runs:
        return []
    outcomes = Counter(str(r.get("outcome") or "running") for r in replays)
    tally = ", ".join(f"{n} {outcome}" for outcome, n in outcomes.most_common())
    steps = ", ".join(f"{run.get('step')} {run.get('status')}" for run in runs)
    return [("replays", f"{len(replays)}" + (f" ({tally})" if tally else "") + f"; runs: {steps}")]


def _progress_line(progress: dict[str, Any]) -> str:
    """``order search: 7 of 59 replays done`` (the planned count is the most it may run)."""
    done, planned = progress.get("replays_done", 0), progress.get("replays_planned", 0)
    return f"{progress.get('step') or 'queued'}: {done} of {planned} replays done"


def _link_line(link: dict[str, Any]) -> str:
    """``case 7 (workflow) acme/app: workflow CI failed, run https://...``: the same CI run."""
    return f"case {link.get('id')} ({link.get('kind')}) {link.get('title') or ''}, run {link.get('run_url')}"


def _cost_line(cost: dict[str, Any]) -> str:
    from flaketriage.workers.cost import TriageCost

    try:
        return TriageCost.from_json(cost).line()
    except (KeyError, TypeError, ValueError):
        return json.dumps(cost)


def _print_case(case: Case) -> None:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for key, value in case_rows(case):
        table.add_row(key, plain(value))
    out.print(table)
