"""The package freeze: the distributions an interpreter has, written and read back as requirements.

Capture records one line per installed distribution (`installed_packages`): ``name==version``, or
``name @ file:///path`` for a project installed from a local directory (an editable install of the
project under test), or ``name @ git+URL@COMMIT`` for one installed from version control. A worker
reads lines back with `parse_freeze`, which also understands what ``pip freeze`` and ``uv pip
freeze`` write (``-e git+...#egg=proj``, ``-e /path``, ``proj==0.1 (editable)``, comments and
options). Capture and the workers share it, so both sides read a line the same way.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import re
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from flaketriage.errors import ReplayEnvironmentError

if TYPE_CHECKING:
    from packaging.requirements import Requirement as Pep508

_NO_VCS = re.compile(r"^#\s*Editable install with no version control \(([^=()\s]+)==")
_EGG = re.compile(r"[#&]egg=([A-Za-z0-9][A-Za-z0-9._-]*)")
_OPTION_WITH_VALUE = {
    "-i", "--index-url", "--extra-index-url", "-f", "--find-links", "--trusted-host",
    "-r", "--requirement", "-c", "--constraint",
}  # fmt: skip


def normalize_name(name: str) -> str:
    """A distribution name as PEP 503 compares them: ``Foo_Bar.baz`` → ``foo-bar-baz``."""
    return re.sub(r"[-_.]+", "-", name.strip()).lower()


@dataclass(frozen=True)
class Requirement:
    """One line of a freeze, read: what to install, or which local project it names."""

    name: str
    """The normalized (PEP 503) name."""
    pin: str
    """The line in normal form (the same package pinned the same way always reads the same):
    ``six==1.16.0``, ``pkg @ https://...``, or ``proj (local)`` for a local project."""
    install: str | None
    """What an installer is given (``six==1.16.0``); None for a local project."""
    path: str | None = None
    """For a local project: where it was on the capturing machine, when the line says."""

    @property
    def local(self) -> bool:
        """Whether it names a project installed from a local directory, not from an index."""
        return self.install is None

    @classmethod
    def local_project(cls, name: str, path: str | None = None) -> Requirement:
        norm = normalize_name(name)
        return cls(name=norm, pin=f"{norm} (local)", install=None, path=path)


def parse_freeze(lines: Iterable[str]) -> tuple[Requirement, ...]:
    """The requirements of a freeze, sorted by name, once per name (the first line wins).

    Blank lines, comments and installer options (``--index-url``: packages come from the index the
    runner's own pip configuration names) are skipped. A line that is no requirement raises
    `ReplayEnvironmentError` saying which.
    """
    found: dict[str, Requirement] = {}
    pending_name: str | None = None  # from pip's "# Editable install with no version control (x==1)"
    for raw in lines:
        line = raw.strip()
        comment = _NO_VCS.match(line)
        if comment:
            pending_name = comment.group(1)
            continue
        line = re.sub(r"(^|\s)#.*$", "", line).strip()  # a URL's "#egg=" fragment has no space before
        if not line:
            continue
        req = _parse_line(line, pending_name)
        pending_name = None
        if req is not None:
            found.setdefault(req.name, req)
    return tuple(found[name] for name in sorted(found))


def _parse_line(line: str, pending_name: str | None) -> Requirement | None:
    editable = re.match(r"^(?:-e|--editable)(?:\s+|=)(.+)$", line)
    if editable:
        return _editable(editable.group(1).strip(), pending_name)
    if line.startswith("-"):
        if line.split("=", 1)[0].split()[0] in _OPTION_WITH_VALUE or line in ("--pre", "--no-index"):
            return None
        raise _not_a_requirement(line, "an installer option flaketriage does not know")
    if line.endswith("(editable)"):
        return Requirement.local_project(_pep508(line.removesuffix("(editable)").strip(), line).name)
    req = _pep508(line, line)
    name = normalize_name(req.name)
    if req.url:
        if req.url.startswith("file:"):
            return Requirement.local_project(name, _file_path(req.url))
        return Requirement(name=name, pin=f"{name} @ {req.url}", install=f"{req.name} @ {req.url}")
    specs = list(req.specifier)
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    marker = f"; {req.marker}" if req.marker else ""
    if len(specs) == 1 and specs[0].operator == "==" and "*" not in specs[0].version:
        version = specs[0].version
        return Requirement(
            name=name,
            pin=f"{name}{extras}=={_version(version)}{marker}",
            install=f"{req.name}{extras}=={version}{marker}",
        )
    spec = ",".join(sorted(str(s) for s in specs))
    return Requirement(name=name, pin=f"{name}{extras}{spec}{marker}", install=str(req))


def _editable(target: str, pending_name: str | None) -> Requirement:
    egg = _EGG.search(target)
    url = target.split("#", 1)[0]
    path = _file_path(url) if url.startswith("file:") else (url if url.startswith("/") else None)
    name = egg.group(1) if egg else pending_name or (path.rstrip("/").rsplit("/", 1)[-1] if path else "")
    if not name:
        raise _not_a_requirement(f"-e {target}", "an editable install whose project name it does not say")
    return Requirement.local_project(name, path)


def _pep508(text: str, line: str) -> Pep508:
    # packaging is imported here, not at the top: capture and every replay import this module, and
    # only reading a freeze back needs it (~30 ms).
    from packaging.requirements import InvalidRequirement
    from packaging.requirements import Requirement as Pep508

    try:
        return Pep508(text)
    except InvalidRequirement as exc:
        raise _not_a_requirement(line, str(exc)) from exc


def _version(text: str) -> str:
    """A version in normal form: ``1.16.0`` and ``1.16`` are the same release (PEP 440)."""
    from packaging.utils import canonicalize_version
    from packaging.version import InvalidVersion, Version

    try:
        return canonicalize_version(Version(text), strip_trailing_zero=True)
    except InvalidVersion:
        return text


def _file_path(url: str) -> str:
    return urllib.parse.unquote(urllib.parse.urlsplit(url).path)


def _not_a_requirement(line: str, why: str) -> ReplayEnvironmentError:
    return ReplayEnvironmentError(
        f"the bundle's package freeze has a line that is not a requirement ({why}): {line!r:.120}; "
        "re-capture the failure, or replay it in the worker's own environment "
        "(FLAKETRIAGE_ENVIRONMENT=worker)"
    )


def installed_packages() -> tuple[str, ...]:
    """One freeze line per distribution of this interpreter, once per name, sorted by normalized name.

    A distribution installed from a local directory (PEP 610 ``dir_info``: an editable install of
    the project under test) is written ``name @ file:///path``, one installed from version control
    ``name @ git+URL@COMMIT``, every other one ``name==version``. A name found twice on ``sys.path``
    keeps its first version: that is the one ``import`` loads. The exception is the ``.egg-info``
    that building a project leaves in its own checkout (``pip install -e .`` does): under ``python
    -m pytest`` the checkout is first on ``sys.path``, and that leftover says only a version, which
    no index may have. It never stands for the project: the installed distribution does when there
    is one, else the checkout itself is the install (``setup.py develop``), written as local.
    """
    seen: dict[str, str] = {}
    leftovers: dict[str, str] = {}  # name → the checkout a build's egg-info was found in, as local
    trees: dict[Path, Path | None] = {}
    for dist in importlib.metadata.distributions():
        with contextlib.suppress(Exception):  # one broken METADATA must not lose the others
            name, version = _name_and_version(dist)
            if not name:
                continue
            key = normalize_name(name)
            checkout = _checkout_of(dist, trees)
            if checkout is not None:
                if key not in seen:
                    leftovers.setdefault(key, f"{name} @ {checkout.as_uri()}")
                continue
            if key not in seen:
                line = _freeze_line(dist, name, version)
                # Import loads the checkout's code, found first: a release installed behind it is not
                # what ran, unless the installer recorded that it installed from a directory.
                seen[key] = line if key not in leftovers or " @ file:" in line else leftovers[key]
    for key, line in leftovers.items():
        seen.setdefault(key, line)
    return tuple(seen[key] for key in sorted(seen))


_PROJECT_FILES = ("pyproject.toml", "setup.py", "setup.cfg")


def _checkout_of(dist: importlib.metadata.Distribution, trees: dict[Path, Path | None]) -> Path | None:
    """The project directory whose build left `dist` there (``proj.egg-info`` beside its
    ``setup.py``, or in its ``src/``), or None for a distribution an installer put in place."""
    metadata = getattr(dist, "_path", None)  # a PathDistribution's directory; others have none
    if not isinstance(metadata, Path) or metadata.suffix != ".egg-info" or not metadata.is_dir():
        return None
    parent = metadata.absolute().parent
    if parent not in trees:
        candidates = [parent, parent.parent] if parent.name == "src" else [parent]
        trees[parent] = next((d for d in candidates if any((d / f).is_file() for f in _PROJECT_FILES)), None)
    return trees[parent]


def _name_and_version(dist: importlib.metadata.Distribution) -> tuple[str | None, str | None]:
    """``Name`` and ``Version`` from the metadata's header lines, read without the e-mail parser
    (which costs a capture a large share of its time on an environment of a few hundred packages)."""
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO")
    if text is None:
        return dist.metadata["Name"], dist.version
    name = version = None
    for line in text.splitlines():
        if not line:
            break  # the headers end at the first blank line; the description follows
        if line.startswith("Name:"):
            name = line[5:].strip()
        elif line.startswith("Version:"):
            version = line[8:].strip()
        if name and version:
            break
    return name, version


def _freeze_line(dist: importlib.metadata.Distribution, name: str, version: str | None) -> str:
    plain = f"{name}=={version if version is not None else dist.version}"
    try:
        info = json.loads(dist.read_text("direct_url.json") or "null")
    except ValueError:
        return plain
    if not isinstance(info, dict) or not isinstance(info.get("url"), str):
        return plain
    url: str = info["url"]
    if "dir_info" in info and url.startswith("file:"):
        return f"{name} @ {url}"
    vcs = info.get("vcs_info")
    if isinstance(vcs, dict) and vcs.get("vcs") and vcs.get("commit_id"):
        return f"{name} @ {vcs['vcs']}+{url}@{vcs['commit_id']}"
    return plain  # a wheel or archive from a URL: the index has the same release, by version
