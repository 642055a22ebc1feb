"""CI results: every test's outcome in every job, read from JUnit XML or sent by the pytest plugin,
as the `ResultsUpload` the service keeps as history (`flaketriage.results.model`)."""

from flaketriage.results.model import (
    RESULTS_SCHEMA_VERSION,
    Attempt,
    Outcome,
    ResultsUpload,
    TestResult,
    upload_key,
)

__all__ = ["RESULTS_SCHEMA_VERSION", "Attempt", "Outcome", "ResultsUpload", "TestResult", "upload_key"]
