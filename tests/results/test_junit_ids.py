"""Test ids read from pytest's JUnit XML are the node ids pytest prints, for the classnames real
suites wrote (six 1.16.0, lithoxyl 21.0.0, mccabe 0.7.0, knack 0.7.2, pyswarms 1.2.0 under pytest 9.2; see
bench/real_projects/history.py), collection errors included."""

from __future__ import annotations

from xml.sax.saxutils import quoteattr

import pytest

from flaketriage.results.junit import read_junit
from flaketriage.results.model import Outcome


def pytest_junit(*cases: tuple[str, str, str]) -> bytes:
    """A document as pytest writes it: one suite named ``pytest``; (classname, name, body) per case."""
    rows = "".join(
        f"<testcase classname={quoteattr(classname)} name={quoteattr(name)} time='0.001'>{body}</testcase>"
        for classname, name, body in cases
    )
    return (
        f"<testsuites><testsuite name='pytest' tests='{len(cases)}'>{rows}</testsuite></testsuites>".encode()
    )


@pytest.mark.parametrize(
    ("classname", "name", "node_id"),
    [
        # six: one module at the top of the checkout
        ("test_six", "test_lazy", "test_six.py::test_lazy"),
        # lithoxyl: tests inside the package
        (
            "lithoxyl.tests.test_stats",
            "test_momentacc_norm",
            "lithoxyl/tests/test_stats.py::test_momentacc_norm",
        ),
        # mccabe: unittest classes not named Test* in a module at the top of the checkout
        (
            "test_mccabe.RegressionTests",
            "test_max_complexity_is_always_an_int",
            "test_mccabe.py::RegressionTests::test_max_complexity_is_always_an_int",
        ),
        (
            "test_mccabe.McCabeTestCase",
            "test_annotated_assignment",
            "test_mccabe.py::McCabeTestCase::test_annotated_assignment",
        ),
        # knack: unittest classes in tests/
        (
            "tests.test_deprecation.TestCommandDeprecation",
            "test_deprecate_command_expired_execute_no_color",
            "tests/test_deprecation.py::TestCommandDeprecation::test_deprecate_command_expired_execute_no_color",
        ),
        # pyswarms: classes in sub-packages, methods inherited from abc_test_optimizer.py, parameters
        (
            "tests.optimizers.test_local_best.TestLocalBestOptimizer",
            "test_obj_with_kwargs",
            "tests/optimizers/test_local_best.py::TestLocalBestOptimizer::test_obj_with_kwargs",
        ),
        (
            "tests.backend.test_generators.TestGenerateSwarm",
            "test_return_values[center1-bounds2]",
            "tests/backend/test_generators.py::TestGenerateSwarm::test_return_values[center1-bounds2]",
        ),
        (
            "tests.backend.test_generators.TestGenerateSwarm",
            "test_bounds_wrong_type[0.1]",
            "tests/backend/test_generators.py::TestGenerateSwarm::test_bounds_wrong_type[0.1]",
        ),
    ],
)
def test_a_test_is_named_by_its_node_id(classname: str, name: str, node_id: str) -> None:
    (result,) = read_junit(pytest_junit((classname, name, "")))
    assert result.test_id == node_id


@pytest.mark.parametrize(
    ("name", "node_id"),
    [
        # knack 0.7.2 without its test requirement `mock`: four modules fail to import
        ("tests.test_help", "tests/test_help.py"),
        ("tests.test_cli_scenarios", "tests/test_cli_scenarios.py"),
        # pyswarms 1.2.0 with today's matplotlib (no matplotlib.axes._subplots)
        ("tests.utils.plotters.test_plotters", "tests/utils/plotters/test_plotters.py"),
        # a conftest.py that fails is reported on its directory (`ERROR pkg/tests`)
        ("pkg.tests", "pkg/tests"),
        ("tests", "tests"),
    ],
)
def test_a_collection_error_is_named_by_its_collectors_node_id(name: str, node_id: str) -> None:
    # pytest writes a collector's report with an empty classname and its dotted path as the name.
    body = "<error message='collection failure'>E   ModuleNotFoundError: No module named 'mock'</error>"
    (result,) = read_junit(pytest_junit(("", name, body)))
    assert (result.test_id, result.outcome) == (node_id, Outcome.ERROR)


def test_xunit1_names_the_collectors_path() -> None:
    # pytest -o junit_family=xunit1 writes the collector's path as the file: exact, dotted or not.
    doc = (
        "<testsuite name='pytest'>"
        "<testcase classname='' name='tests.test_broken' file='tests/test_broken.py'><error/></testcase>"
        "<testcase classname='' name='pkg.tests' file='pkg/tests'><error/></testcase>"
        "<testcase classname='' name='test_top' file='test_top.py'><error/></testcase>"
        "</testsuite>"
    )
    ids = [result.test_id for result in read_junit(doc.encode())]
    assert ids == ["tests/test_broken.py", "pkg/tests", "test_top.py"]


def test_a_module_skipped_whole_is_named_by_its_path() -> None:
    body = "<skipped type='pytest.skip' message='no'>tests/sub/test_skipmod.py:2: no</skipped>"
    (result,) = read_junit(pytest_junit(("", "tests.sub.test_skipmod", body)))
    assert (result.test_id, result.outcome) == ("tests/sub/test_skipmod.py", Outcome.SKIPPED)


def test_another_runners_empty_classname_keeps_the_name() -> None:
    data = b"<testsuite name='jest tests'><testcase classname='' name='renders a.b'/></testsuite>"
    (result,) = read_junit(data)
    assert result.test_id == "renders a.b"
