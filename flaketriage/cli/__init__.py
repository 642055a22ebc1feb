"""The ``flaketriage`` command line (typer + rich)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from flaketriage import __version__
from flaketriage.cli import bundles, cases, doctor, garbage, notify, results, run, service, telemetry
from flaketriage.cli.console import Commands, err, labelled
from flaketriage.errors import FlaketriageError
from flaketriage.process import interrupts

app = typer.Typer(
    cls=Commands,  # flags without a <bool> in --help; a usage error on one line
    name="flaketriage",
    help="Capture failing CI tests and training runs, replay them, and say whether they are real or flaky.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(bundles.app, name="bundle")
app.add_typer(cases.app, name="cases")
app.add_typer(results.app, name="results")
app.command(context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True})(run.capture)
app.command()(run.triage)
app.command()(telemetry.telemetry)
app.command()(notify.notify)
app.command()(doctor.doctor)
app.command()(service.serve)
app.command()(service.worker)
app.command()(service.beat)
app.command(name="gc")(garbage.gc)


def _version(value: bool) -> None:
    if value:
        print(f"flaketriage {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """flaketriage: is it real, is it flaky, is it the GPU?"""


@app.command()
def demo(
    keep: Annotated[bool, typer.Option(help="Keep the demo project (its path is printed).")] = True,
    serve: Annotated[
        bool | None,
        typer.Option(
            "--serve/--no-serve",
            help="After the triage, keep serving the dashboard until Ctrl-C (default: when the output "
            "is a terminal; in CI or a script the demo exits).",
            show_default=False,
        ),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(min=1, max=65535, help="The service's port (default: a free one).", show_default=False),
    ] = None,
) -> None:
    """Build a small real project with two failures and have the embedded service triage them: cases,
    verdicts, an issue and a quarantine entry, shown on the dashboard."""
    from flaketriage.cli.demo import run_demo

    run_demo(keep=keep, serve=serve, port=port)


def main() -> None:
    """Console-script entry point: flaketriage errors become one red line and exit status 2;
    SIGINT, SIGTERM and SIGHUP end the run cleanly with status 128 + N."""
    interrupts.install()
    try:
        app()
    except FlaketriageError as exc:
        err.print(labelled("error:", "red", exc))  # one line, whatever the message holds
        sys.exit(2)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except interrupts.Terminated as exc:
        err.print(f"stopped by {exc.name}")
        sys.exit(128 + exc.signum)
