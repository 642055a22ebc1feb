"""Every exception class flaketriage defines is in the error tree (`flaketriage.errors`), so
``except FlaketriageError`` catches whatever flaketriage raises on purpose, save the few below.

The package is walked in a child interpreter: importing every module here would load what other
tests check stays unloaded (boto3, torch, the workers).
"""

from __future__ import annotations

import json
import subprocess
import sys

ALLOWED: dict[str, str] = {
    "flaketriage.process.interrupts.Terminated": (
        "a BaseException, like KeyboardInterrupt: SIGTERM has to unwind through every "
        "``except Exception`` (and ``except FlaketriageError``) to the top"
    ),
    "flaketriage.process.reaper._Stop": (
        "a BaseException for the same reason: it stops the reaper's thread, through any handler"
    ),
    "flaketriage.bundle.transfer._Stopped": (
        "ends a copy when the transfer is interrupted; a FlaketriageError raised by a copy is "
        "recorded as that copy's failure (`_run_all`), which an interruption is not"
    ),
    "flaketriage.testing.failure.MLAssertionError": (
        "an AssertionError, so pytest reports a failed ML assertion as a test's failure, not an "
        "error; it is the user's test failing, not flaketriage (its subclasses with it)"
    ),
}
"""Exception classes outside the tree (with their subclasses), and why."""

_WALK = r"""
import importlib, inspect, json, pkgutil, sys
import flaketriage
from flaketriage.errors import FlaketriageError

allowed = set(json.loads(sys.argv[1]))
outside, unimportable, seen = [], [], set()
for info in pkgutil.walk_packages(flaketriage.__path__, "flaketriage."):
    if info.name == "flaketriage.__main__" or ".sitecustomize" in info.name:
        continue  # the CLI's entry point runs it; sitecustomize is loaded into replays only
    try:
        module = importlib.import_module(info.name)
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] == "flaketriage":
            raise
        unimportable.append(f"{info.name} ({exc.name} is not installed)")
        continue
    for cls in vars(module).values():
        if not (inspect.isclass(cls) and issubclass(cls, BaseException)):
            continue
        if cls.__module__ != module.__name__ or issubclass(cls, FlaketriageError):
            continue
        names = {f"{base.__module__}.{base.__qualname__}" for base in cls.__mro__}
        seen.update(names & allowed)
        if not names & allowed:
            outside.append(f"{cls.__module__}.{cls.__qualname__}")
print(json.dumps({"outside": outside, "unimportable": unimportable, "seen": sorted(seen)}))
"""


def _walk() -> dict[str, list[str]]:
    done = subprocess.run(
        [sys.executable, "-c", _WALK, json.dumps(sorted(ALLOWED))],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    found: dict[str, list[str]] = json.loads(done.stdout)
    return found


def test_every_exception_class_is_in_the_error_tree() -> None:
    found = _walk()
    assert found["outside"] == [], (
        "exception classes outside flaketriage.errors' tree: derive each from FlaketriageError (or "
        "its subclass that says what failed), or add it to ALLOWED with the reason it cannot"
        + (f"; not checked, not importable here: {found['unimportable']}" if found["unimportable"] else "")
    )
    # An allowed class that was renamed or removed leaves the list.
    assert found["seen"] == sorted(ALLOWED)
