"""The results of one CI job: every test's outcome, sent to ``POST /v1/results``.

This is the contract between whatever reads a runner's results (`flaketriage.results.junit` for a
JUnit XML file, the pytest plugin's session summary) and the service that keeps the history: one
`ResultsUpload` per job and attempt (a sharded job sends one per shard), versioned by
``schema_version``, unknown fields refused, signed like events. ``upload_id`` makes a re-sent
upload the same delivery (the service answers 200 and records nothing).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from flaketriage.errors import ConfigError
from flaketriage.variant import Variant, checked_variant

RESULTS_SCHEMA_VERSION = 1
MAX_TESTS = 200_000
"""The most tests one upload holds (a sharded suite sends one upload per shard)."""
MAX_ATTEMPTS = 20
MAX_TEST_ID = 2_000
MAX_MESSAGE = 2_000
"""A failure message is at most this many characters (the readers cut theirs to it): the history
keeps the gist, the bundle the rest."""


Text = Annotated[str, StringConstraints(pattern=r"^[^\x00]*$")]
"""Text a record can hold: no NUL (and, as every pydantic string, no lone surrogate: refused as
``string_unicode``). Checked by pydantic's own validator, not a Python call per field: an upload
holds 50,000 test ids."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Outcome(StrEnum):
    """A test's outcome in one attempt."""

    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    """Broke outside the test's own assertions (a fixture, setup or teardown, the collection)."""
    SKIPPED = "skipped"

    @property
    def failing(self) -> bool:
        return self in (Outcome.FAILED, Outcome.ERROR)


class Attempt(_Model):
    """An earlier attempt of a test that a rerun plugin ran again in the same job."""

    outcome: Outcome
    duration_s: float = Field(default=0.0, ge=0, le=7 * 86400)
    message: Text | None = Field(default=None, max_length=MAX_MESSAGE)


class TestResult(_Model):
    """One test in one job: its final outcome, and the attempts before it when it was rerun."""

    __test__ = False  # not a pytest test class

    test_id: Text = Field(min_length=1, max_length=MAX_TEST_ID)
    """``path::Class::name`` for pytest; ``classname.name`` for other runners' JUnit."""
    outcome: Outcome
    duration_s: float = Field(default=0.0, ge=0, le=7 * 86400)
    """Of the final attempt."""
    attempts: tuple[Attempt, ...] = Field(default=(), max_length=MAX_ATTEMPTS)
    """The earlier attempts, oldest first (empty when it ran once)."""
    message: Text | None = Field(default=None, max_length=MAX_MESSAGE)
    """The final attempt's failure message, else the last failing attempt's."""
    signature: str | None = Field(default=None, pattern=r"^[0-9a-f]{16,128}$")
    """The failure's fingerprint when the sender knows it (the pytest plugin): a quarantine entry
    with signatures forgives only failures that match one."""
    quarantined: bool = False
    """The test ran under quarantine: its failure did not fail the job, and still counts here."""

    @property
    def failed_attempts(self) -> int:
        return sum(1 for a in self.attempts if a.outcome.failing) + (1 if self.outcome.failing else 0)

    @property
    def passed_on_retry(self) -> bool:
        """Failed, then passed when run again in the same job: flaky by the industry's definition."""
        return self.outcome is Outcome.PASSED and any(a.outcome.failing for a in self.attempts)

    @property
    def lost_s(self) -> float:
        """CI seconds this test cost without need: every failing attempt, and every rerun after one."""
        spent = [a.duration_s for a in self.attempts] + [self.duration_s]
        outcomes = [a.outcome for a in self.attempts] + [self.outcome]
        lost = 0.0
        after_failure = False
        for outcome, seconds in zip(outcomes, spent, strict=True):
            if outcome.failing or after_failure:
                lost += seconds
            after_failure = after_failure or outcome.failing
        return lost


class ResultsUpload(_Model):
    """The results of one job (or one shard of it) and where it ran."""

    schema_version: Literal[1] = 1
    upload_id: str = Field(pattern=r"^[0-9A-Za-z_.:-]{8,128}$")
    """The delivery's key: `upload_key` of what it holds, so a re-sent upload is a duplicate."""
    source: Literal["junit", "pytest"] = "junit"
    repository: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,100}/[A-Za-z0-9_.-]{1,100}$")
    branch: Text | None = Field(default=None, max_length=255)
    commit: str | None = Field(default=None, pattern=r"^[0-9a-f]{7,64}$")
    pull_request: int | None = Field(default=None, ge=1, le=2**31 - 1)
    run_id: Text | None = Field(default=None, max_length=200)
    run_url: Text | None = Field(default=None, max_length=2000)
    job: Text | None = Field(default=None, max_length=200)
    attempt: int = Field(default=1, ge=1, le=1000)
    variant: Variant = Field(default_factory=dict)
    tests: tuple[TestResult, ...] = Field(max_length=MAX_TESTS)

    @field_validator("repository")
    @classmethod
    def _owner_and_name(cls, value: str) -> str:
        if any(part in (".", "..") for part in value.split("/")):
            raise ValueError("an owner or a name cannot be '.' or '..'")
        return value

    @field_validator("variant", mode="before")
    @classmethod
    def _variant(cls, value: object) -> object:
        if isinstance(value, dict):
            try:
                return checked_variant({str(k): v for k, v in value.items()})
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
        return value

    def counts(self) -> dict[str, int]:
        """How many tests ended in each outcome, and how many passed on retry."""
        out = {o.value: 0 for o in Outcome}
        for test in self.tests:
            out[test.outcome.value] += 1
        out["passed_on_retry"] = sum(1 for t in self.tests if t.passed_on_retry)
        return out

    def to_json(self) -> bytes:
        """The body on the wire: compact JSON, UTF-8."""
        return self.model_dump_json(exclude_defaults=False).encode("utf-8")


def upload_key(
    *,
    repository: str,
    run_id: str | None,
    job: str | None,
    attempt: int,
    variant: Variant,
    parts: Iterable[bytes],
) -> str:
    """A stable id for an upload: the run, job, attempt and variant it is of, and the bytes of the
    files (or summary) it was read from; the same files sent twice are one delivery."""
    digest = hashlib.sha256()
    head = json.dumps([repository, run_id, job, attempt, variant], sort_keys=True).encode()
    digest.update(len(head).to_bytes(8, "big") + head)
    for part in parts:
        digest.update(hashlib.sha256(part).digest())
    return "up-" + digest.hexdigest()[:40]
