"""The columns an occurrence's provenance fills: the CI run it came from and the branch it names.

Provenance is JSON, which no index reaches (and which PostgreSQL cannot even read field by field
where a sender put an escaped NUL in it), so what the dashboard finds occurrences by is copied out
of it when an occurrence is recorded: its run's URL, which a results upload of the same run names
too (``result_uploads.run_url``: that upload knows the run's branch), and the branch a failed
workflow run names itself (``head_branch``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flaketriage.records.text import storable_text

MAX_RUN_URL_BYTES = 1000
"""A run URL longer than this (as UTF-8) is not kept: CI providers' are under 200 bytes, and an
index entry has a limit of its own."""
MAX_BRANCH = 255
"""As ``result_uploads.branch`` holds a branch (git allows longer names; a cut one is a wrong one)."""
BRANCH_KEYS = ("head_branch", "branch")
"""Where a provenance names its branch: a GitHub workflow run's ``head_branch``, or ``branch``."""


def run_url_of(provenance: Mapping[str, Any] | None) -> str | None:
    """The run URL `provenance` names, as a results upload of the same run names it; None when it
    names none (or one too long to keep)."""
    url = (provenance or {}).get("run_url")
    if not isinstance(url, str) or not url.strip():
        return None
    url = storable_text(url.strip())
    return url if len(url.encode("utf-8")) <= MAX_RUN_URL_BYTES else None


def branch_of(provenance: Mapping[str, Any] | None) -> str | None:
    """The branch `provenance` names; None when it names none (or one too long to keep)."""
    for key in BRANCH_KEYS:
        branch = (provenance or {}).get(key)
        if isinstance(branch, str) and branch.strip():
            branch = storable_text(branch.strip())
            return branch if len(branch) <= MAX_BRANCH else None
    return None
