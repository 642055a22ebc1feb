"""The pytest plugin's session summary: every test's outcome, duration and rerun attempts, sent to
the service's CI history (``POST /v1/results``) when the session ends.

Collected from the reports pytest logs (in the controller of a pytest-xdist run, which sees every
worker's), standard library only: a passing suite pays a dictionary update per report. The model
and the sender are imported when the summary is sent.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flaketriage.results.model import ResultsUpload
    from flaketriage.settings import Settings
    from flaketriage.variant import Variant


@dataclass
class _Test:
    outcome: str = "passed"
    duration_s: float = 0.0
    message: str | None = None
    attempts: list[tuple[str, float, str | None]] = field(default_factory=list)
    """Earlier attempts a rerun plugin ran (pytest-rerunfailures' ``rerun`` reports)."""
    failing_phase: bool = False


class SessionResults:
    """The outcome of every test of one session, by the id the session's bundles give it."""

    def __init__(self) -> None:
        self.tests: dict[str, _Test] = {}

    def add(self, rel: str, report: Any) -> None:
        """Fold one report (setup, call or teardown of one attempt) into its test's result."""
        test = self.tests.setdefault(rel, _Test())
        outcome = str(report.outcome)
        duration = float(getattr(report, "duration", 0.0) or 0.0)
        message = _message(report) if outcome in ("failed", "rerun") else None
        if outcome == "rerun":
            # This attempt failed and will run again: everything it did so far is one earlier attempt.
            test.attempts.append(("failed", test.duration_s + duration, message))
            test.outcome, test.duration_s, test.message, test.failing_phase = "passed", 0.0, None, False
            return
        test.duration_s += duration
        if outcome == "failed":
            if not test.failing_phase:
                test.outcome = "failed" if report.when == "call" else "error"
                test.message = message
            test.failing_phase = True
        elif outcome == "skipped" and not test.failing_phase:
            test.outcome = "skipped"

    def upload(
        self,
        settings: Settings,
        quarantined: set[str],
        *,
        cwd: Path,
        environ: dict[str, str] | None = None,
        variant: Variant | None = None,
    ) -> ResultsUpload | None:
        """The session's upload, or None when no test ran or no repository is known. `variant` is
        the session's (`flaketriage.ci.quarantine_list.run_variant`, the one its quarantine entries
        are matched with); None: `current_variant` with ``FLAKETRIAGE_GPU`` alone."""
        from flaketriage.results.ci_context import RunContext, detect
        from flaketriage.results.model import Attempt, TestResult
        from flaketriage.variant import GPU_VARIABLE, current_variant

        if not self.tests:
            return None
        env = dict(os.environ if environ is None else environ)
        context = detect(env, cwd, overrides=RunContext(repository=settings.repository))
        if not context.repository:
            return None
        tests = tuple(
            TestResult(
                test_id=rel[:2000],
                outcome=t.outcome,  # type: ignore[arg-type]
                duration_s=round(t.duration_s, 6),
                message=t.message,
                attempts=tuple(
                    Attempt(outcome=o, duration_s=round(d, 6), message=m)  # type: ignore[arg-type]
                    for o, d, m in t.attempts[-20:]
                ),
                quarantined=rel in quarantined,
            )
            for rel, t in self.tests.items()
        )
        if variant is None:
            variant = current_variant(env, env.get(GPU_VARIABLE))
        body = repr(sorted((t.test_id, t.outcome, len(t.attempts)) for t in tests)).encode("utf-8", "replace")
        return context.upload(
            source="pytest", variant=variant, tests=tests, parts=[body, str(os.getpid()).encode()]
        )


def _message(report: Any) -> str | None:
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    text = getattr(crash, "message", None) or str(getattr(report, "longrepr", "") or "")
    first = text.strip().splitlines()[0] if text.strip() else ""
    return "".join(c if c.isprintable() else " " for c in first)[:2000] or None


def send_results(upload: ResultsUpload, settings: Settings) -> str:
    """Send the session's upload; what the summary line says about it."""
    from flaketriage.ci.notify import post_signed

    base = settings.resolved_service_url()
    secret = settings.webhook_secret.get_secret_value().encode() if settings.webhook_secret else b""
    if not base or not secret:
        return "not sent (set FLAKETRIAGE_NOTIFY_URL and FLAKETRIAGE_WEBHOOK_SECRET)"
    answer = post_signed(
        base.rstrip("/") + "/v1/results", upload.to_json(), secret, timeout_s=30.0, retries=2
    )
    outcome = answer.json().get("outcome", "sent")
    return f"{len(upload.tests)} results {outcome}"
