"""Test ids from a JUnit ``<testcase>``: pytest's node ids given back from its dotted classnames.

pytest's ids (the root is ``<testsuites name="pytest tests">``, the suite is named ``pytest``, or
the test case names a ``file`` ending in ``.py``) are its node ids, given back from the
``classname`` it wrote: the node id's path with ``/`` as ``.`` and ``.py`` dropped, then the
classes. With a ``file`` attribute (``junit_family=xunit1``) the path is that file and the parts
after it classes: exact, even for a directory with a dot in its name. Without one (xunit2, the
default) the module is the last dotted part named ``test_*`` or ``*_test`` (pytest's default
``python_files``) and the parts after it classes, whatever they are called (a unittest class such
as ``RegressionTests`` too): ``tests.unit.test_io.TestRead`` and ``test_empty[gz]`` are
``tests/unit/test_io.py::TestRead::test_empty[gz]``; a file collected under other names keeps
``classname.name`` (`pytest_node_id` then says no more than it knows).

A collector that pytest reports as a test case (a module that failed to collect or was skipped
whole, a directory whose ``conftest.py`` failed) has an empty classname and its path, dotted, as
the name: its node id is the ``file`` when one is written, else the path, a module's
(``tests.test_help`` is ``tests/test_help.py``, ``test_top`` is ``test_top.py``) when its last part
names a test module and otherwise a directory's (``pkg.tests`` is ``pkg/tests``).

Any other runner's id is ``classname.name`` (go: ``example.com/pkg.TestX/sub``; Surefire:
``com.example.FooTest.bar``), or the name alone when the class is empty or is the name
(jest-junit writes ``describe test`` as both); ids are cut to `MAX_TEST_ID` characters.
"""

from __future__ import annotations

import functools

from flaketriage.results.model import MAX_TEST_ID


def test_id(classname: str, name: str, file: str = "", *, pytest: bool) -> str:
    """The id of the test a ``<testcase>`` names (its attributes stripped of surrounding blanks);
    `pytest` when the document was written by pytest."""
    name = name or "(unnamed)"
    if pytest and not classname:
        return _pytest_collector(name, file)[:MAX_TEST_ID].rstrip()
    if pytest:
        prefix = _pytest_prefix(classname, file)
        if prefix is not None:
            return f"{prefix}::{name}"[:MAX_TEST_ID].rstrip()
    if not classname or classname == name:
        return name[:MAX_TEST_ID].rstrip()
    return f"{classname}.{name}"[:MAX_TEST_ID].rstrip()


def pytest_node_id(classname: str, name: str, file: str = "") -> str | None:
    """The node id of a test pytest wrote, or None when no part of its classname names a test
    module and no ``file`` says which (a file collected under other ``python_files``)."""
    classname, name, file = classname.strip(), name.strip(), file.strip()
    if not classname:
        return test_id(classname, name, file, pytest=True)
    if _pytest_prefix(classname, file) is None:
        return None
    return test_id(classname, name, file, pytest=True)


@functools.lru_cache(maxsize=4096)
def _pytest_prefix(classname: str, file: str) -> str | None:
    """``tests/unit/test_io.py::TestRead`` for pytest's ``tests.unit.test_io.TestRead``; None when
    no part names a test module."""
    parts = classname.split(".")
    path = file.replace("\\", "/")
    if path.endswith(".py"):
        module = path[: -len(".py")].replace("/", ".").split(".")
        if parts[: len(module)] == module:
            return "::".join([path, *parts[len(module) :]])
    found = _module_index(parts)
    if found is None:
        return None
    return "::".join(["/".join(parts[: found + 1]) + ".py", *parts[found + 1 :]])


def _pytest_collector(name: str, file: str) -> str:
    """``tests/test_help.py`` for the collector pytest wrote as ``name="tests.test_help"`` with no
    classname."""
    path = file.replace("\\", "/")
    if path and path.removesuffix(".py").replace("/", ".") == name:
        return path
    parts = name.split(".")
    return "/".join(parts) + (".py" if _module_index(parts) == len(parts) - 1 else "")


def _module_index(parts: list[str]) -> int | None:
    """Where the module is in pytest's dotted path: the last part named ``test_*`` or ``*_test``."""
    return max(
        (i for i, part in enumerate(parts) if part.startswith("test_") or part.endswith("_test")),
        default=None,
    )
