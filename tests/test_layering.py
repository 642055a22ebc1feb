"""The package map in README.md ("Packages") as a test: which package may import which.

Role packages import the core and never each other; the one drawn exception is the guards'
capture on trip, which goes through ``flaketriage.capture.record``. The light packages stay light.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "flaketriage"
ROLES = ("ci", "guards", "testing", "workers", "orchestrator", "cli")

ALLOWED: dict[str, set[str]] = {
    "core": {"core"},
    "ci": {"core", "ci"},
    "guards": {"core", "guards"},
    "testing": {"core", "testing"},
    "workers": {"core", "workers"},
    "orchestrator": {"core", "orchestrator"},
    "cli": {"core", *ROLES},
}
"""What each role may import."""

CORE_PACKAGES = {
    "bundle", "capture", "failure", "files", "process", "records", "results", "store", "text", "work",
}  # fmt: skip
"""The core's packages, each named by its noun."""

CORE_FLAT = {
    "__init__",
    "__main__",
    "dependencies",
    "errors",
    "events",
    "quarantine",
    "settings",
    "signing",
    "variant",
    "versions",
}
"""The core modules that stand alone: the error tree, the settings, the messages between the roles
(events, the quarantine document, signatures) and the two light helpers every role may use."""

TESTING_CORE = {"errors", "versions", "dependencies"}
"""The core modules ``flaketriage.testing`` may use: none of them loads pydantic."""


def role_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ROLES else "core"


def imports_of(path: Path) -> list[str]:
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return [name for name in found if name == "flaketriage" or name.startswith("flaketriage.")]


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "sitecustomize" not in p.parts)


def allowed(source_role: str, target: str) -> bool:
    return role_of(target) in ALLOWED[source_role]


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_imports_follow_the_package_map(path: Path) -> None:
    source = module_name(path)
    src_role = role_of(source)
    if source == "flaketriage.__main__":
        return  # `python -m flaketriage` is the CLI's entry point
    bad = [t for t in imports_of(path) if not allowed(src_role, t)]
    assert not bad, f"{source} ({src_role}) imports {bad}; see the Packages table in docs/architecture.md"


def test_testing_uses_only_light_core_modules() -> None:
    for path in (PACKAGE / "testing").rglob("*.py"):
        for target in imports_of(path):
            if role_of(target) == "core":
                assert target.split(".")[1] in TESTING_CORE, f"{path.name} imports {target}"


def test_light_packages_do_not_load_the_heavy_ones() -> None:
    code = (
        "import sys, flaketriage.testing, flaketriage.ci.pytest_plugin;"
        "heavy = [m for m in ('pydantic', 'torch', 'numpy', 'flaketriage.bundle.manifest',"
        " 'flaketriage.workers', 'httpx', 'celery', 'sqlalchemy') if m in sys.modules];"
        "print(','.join(heavy))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""


def test_the_core_is_its_packages_and_a_few_flat_modules() -> None:
    """A new core module goes into the package of its noun (or is added here with a reason)."""
    flat = {p.stem for p in PACKAGE.glob("*.py")}
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert flat == CORE_FLAT
    assert packages == CORE_PACKAGES | set(ROLES)
