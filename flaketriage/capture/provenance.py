"""Provenance: which CI provider, run, job, attempt and runner a failure came from."""

from __future__ import annotations

import socket
from collections.abc import Mapping

from flaketriage.bundle.manifest import Provenance


def detect_provenance(env: Mapping[str, str]) -> Provenance:
    """Read the CI provider's own variables; outside CI only the host is known."""
    # Provenance is for people to read, never replayed: bytes that are not UTF-8 become U+FFFD.
    env = {k: v.encode("utf-8", "surrogateescape").decode("utf-8", "replace") for k, v in env.items()}
    host = socket.gethostname()
    if env.get("GITHUB_ACTIONS") == "true":
        server = env.get("GITHUB_SERVER_URL", "https://github.com")
        run_url = None
        if env.get("GITHUB_REPOSITORY") and env.get("GITHUB_RUN_ID"):
            run_url = f"{server}/{env['GITHUB_REPOSITORY']}/actions/runs/{env['GITHUB_RUN_ID']}"
        return Provenance(
            ci_provider="github-actions",
            run_url=run_url,
            job=env.get("GITHUB_JOB"),
            attempt=env.get("GITHUB_RUN_ATTEMPT"),
            runner=env.get("RUNNER_NAME"),
            host=host,
        )
    if env.get("GITLAB_CI") == "true":
        return Provenance(
            ci_provider="gitlab-ci",
            run_url=env.get("CI_JOB_URL"),
            job=env.get("CI_JOB_NAME"),
            attempt=None,
            runner=env.get("CI_RUNNER_DESCRIPTION"),
            host=host,
        )
    if env.get("BUILDKITE") == "true":
        return Provenance(
            ci_provider="buildkite",
            run_url=env.get("BUILDKITE_BUILD_URL"),
            job=env.get("BUILDKITE_LABEL"),
            attempt=env.get("BUILDKITE_RETRY_COUNT"),
            runner=env.get("BUILDKITE_AGENT_NAME"),
            host=host,
        )
    if env.get("JENKINS_URL"):
        return Provenance(
            ci_provider="jenkins",
            run_url=env.get("BUILD_URL"),
            job=env.get("JOB_NAME"),
            runner=env.get("NODE_NAME"),
            host=host,
        )
    if env.get("CIRCLECI") == "true":
        return Provenance(
            ci_provider="circleci",
            run_url=env.get("CIRCLE_BUILD_URL"),
            job=env.get("CIRCLE_JOB"),
            runner=env.get("CIRCLE_NODE_INDEX"),
            host=host,
        )
    return Provenance(ci_provider="local" if not env.get("CI") else "unknown-ci", host=host)
