"""``flaketriage results upload``: send a CI job's JUnit XML results to the service's history."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from flaketriage.cli.console import JsonOption, err, labelled, settings_for
from flaketriage.errors import ConfigError, NotifyError
from flaketriage.settings import Settings
from flaketriage.variant import checked_variant, current_variant, parse_variant

if TYPE_CHECKING:
    from flaketriage.results.ci_context import RunContext
    from flaketriage.results.model import ResultsUpload

app = typer.Typer(
    help="CI results: every test's outcome, kept as history by the service.", no_args_is_help=True
)


def results_url(settings: Settings, to: str | None) -> str:
    """Where uploads go: `to`, else the service's ``/v1/results`` (FLAKETRIAGE_SERVICE_URL, or the
    base of FLAKETRIAGE_NOTIFY_URL)."""
    if to:
        return to
    base = settings.resolved_service_url()
    if not base:
        raise ConfigError(
            "no service to send results to: pass --to https://HOST/v1/results, or set "
            "FLAKETRIAGE_SERVICE_URL (or FLAKETRIAGE_NOTIFY_URL, https://HOST/v1/events)"
        )
    return base.rstrip("/") + "/v1/results"


def build_upload(
    files: list[Path],
    context: RunContext,
    variant: dict[str, str],
    *,
    max_bytes: int,
) -> ResultsUpload:
    """One upload of every test in `files` (JUnit XML), keyed by the run, job, attempt, variant and
    the files' bytes: the same files sent twice are one delivery."""
    from flaketriage.results.junit import read_junit_file
    from flaketriage.results.model import MAX_TESTS, TestResult

    tests: list[TestResult] = []
    parts: list[bytes] = []
    for path in files:
        read = read_junit_file(path, max_bytes=max_bytes)
        tests.extend(read.tests)
        parts.append(read.digest)
    if len(tests) > MAX_TESTS:
        raise ConfigError(
            f"{len(tests)} tests in {len(files)} file(s); one upload holds at most {MAX_TESTS}: upload "
            "each shard's files separately"
        )
    if not context.repository:
        raise ConfigError(
            "which repository are these results of? pass --repo OWNER/NAME (no CI variables or git "
            "origin said)"
        )
    return context.upload(source="junit", variant=variant, tests=tests, parts=parts)


@app.command()
def upload(
    files: Annotated[
        list[Path],
        typer.Argument(
            help="JUnit XML files (pytest --junitxml, jest-junit, gotestsum, Surefire ...).",
            metavar="FILE...",
            show_default=False,
        ),
    ],
    repo: Annotated[
        str | None,
        typer.Option("--repo", help="OWNER/NAME (default: the CI's, else git's origin).", show_default=False),
    ] = None,
    branch: Annotated[
        str | None, typer.Option(help="Default: the CI's, else git's.", show_default=False)
    ] = None,
    commit: Annotated[
        str | None,
        typer.Option(help="Default: the CI's (a pull request's head), else git's HEAD.", show_default=False),
    ] = None,
    pull_request: Annotated[
        int | None, typer.Option("--pull-request", min=1, help="Default: the CI's.", show_default=False)
    ] = None,
    run_id: Annotated[
        str | None, typer.Option("--run-id", help="Default: the CI's.", show_default=False)
    ] = None,
    run_url: Annotated[
        str | None, typer.Option("--run-url", help="Default: the CI's.", show_default=False)
    ] = None,
    job: Annotated[str | None, typer.Option(help="Default: the CI's.", show_default=False)] = None,
    attempt: Annotated[
        int | None, typer.Option(min=1, help="Default: the CI's, else 1.", show_default=False)
    ] = None,
    variant: Annotated[
        list[str] | None,
        typer.Option(
            "--variant",
            metavar="K=V",
            help="Add to the variant (default: os and python, plus FLAKETRIAGE_VARIANT); repeatable.",
            show_default=False,
        ),
    ] = None,
    to: Annotated[
        str | None,
        typer.Option(
            "--to", help="The results endpoint (default: the service's /v1/results).", show_default=False
        ),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Read and count, send nothing.")] = False,
    strict: Annotated[
        bool, typer.Option("--strict", help="Exit 1 when the upload could not be sent.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Send every test's outcome in these JUnit XML files to the service: its CI history finds tests
    that fail and pass on one commit, resolves fixed failures, and updates the pull request's check
    run. Exits 0 when the service cannot be reached (a CI job should not fail for it), unless --strict."""
    from flaketriage.ci.notify import post_signed
    from flaketriage.results.ci_context import RunContext, detect

    settings = settings_for(None)
    extra: dict[str, str] = {}
    for item in variant or []:
        extra.update(parse_variant(item, where="--variant"))
    chosen = checked_variant({**current_variant(os.environ), **extra})
    overrides = RunContext(
        repository=repo, branch=branch, commit=commit.lower() if commit else None, pull_request=pull_request,
        run_id=run_id, run_url=run_url, job=job, attempt=attempt or 1,
    )  # fmt: skip
    context = detect(os.environ, Path.cwd(), overrides=overrides)
    built = build_upload(files, context, chosen, max_bytes=settings.max_results_mb * 1024 * 1024)
    counts = built.counts()
    summary: dict[str, object] = {
        "upload_id": built.upload_id,
        "repository": built.repository,
        "branch": built.branch,
        "commit": built.commit,
        "pull_request": built.pull_request,
        "variant": built.variant,
        "tests": len(built.tests),
        **counts,
    }
    if dry_run:
        _say(summary, None, as_json)
        return
    url = results_url(settings, to)
    secret = settings.webhook_secret.get_secret_value().encode() if settings.webhook_secret else b""
    if not secret:
        raise ConfigError("results are signed: set FLAKETRIAGE_WEBHOOK_SECRET to the service's secret")
    try:
        response = post_signed(url, built.to_json(), secret, timeout_s=60.0)
    except NotifyError as exc:
        err.print(labelled("error:", "red", f"the results were not sent: {exc}"))
        if strict:
            raise typer.Exit(1) from None
        return
    _say(summary, response.json(), as_json)


def _say(summary: dict[str, object], answer: dict[str, object] | None, as_json: bool) -> None:
    if as_json:
        print(json.dumps({**summary, "answer": answer}, indent=2, sort_keys=True))
        return
    where = f"{summary['repository']}@{str(summary['commit'] or '?')[:12]}"
    line = (
        f"{summary['tests']} tests ({summary['passed']} passed, {summary['failed']} failed, "
        f"{summary['error']} errors, {summary['skipped']} skipped, "
        f"{summary['passed_on_retry']} passed on retry) of {where}"
    )
    if answer is None:
        err.print(labelled("read:", "cyan", line + " (--dry-run: not sent)"))
        return
    outcome = str(answer.get("outcome"))
    storm = " - a storm: most tests failed, recorded as one outage" if answer.get("storm") else ""
    err.print(labelled(f"{escape(outcome)}:", "green", line + storm))
