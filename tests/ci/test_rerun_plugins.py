"""The rerun command loads the plugins the session loaded by name, and pytest-repeat's ids with it."""

from __future__ import annotations

from pathlib import Path

from flaketriage.ci.pytest_bundle import SessionFacts, rerun_argv
from flaketriage.ci.pytest_plugin import named_plugins


def _facts(**extra: object) -> SessionFacts:
    here = Path("/work/p")
    return SessionFacts(invocation_dir=here, rootdir=here, verbose=0, force_short_summary=False,
                        started_ns=0, **extra)  # type: ignore[arg-type]  # fmt: skip


def test_plugins_named_on_the_command_line_are_read() -> None:
    args = ["-p", "flaketriage", "-pno:cacheprovider", "-prepeat", "-p", "no:randomly", "--pdb", "-p"]
    assert named_plugins(args) == ("flaketriage", "repeat")
    assert named_plugins(["tests", "-q"]) == ()


def test_the_rerun_has_the_sessions_plugins_and_repeat_options_before_the_node_id() -> None:
    facts = _facts(plugins=("flaketriage",), repeat=(3, "module"), xdist=True)
    argv = rerun_argv("t.py::test_x[2-3]", facts)
    options = argv[: argv.index("--")]
    assert argv[-2:] == ["--", "t.py::test_x[2-3]"]
    assert options[-8:] == [
        "-p",
        "flaketriage",
        "-p",
        "repeat",
        "--count=3",
        "--repeat-scope=module",
        "-n",
        "0",
    ]
    # A session that loaded pytest-repeat by name loads it once.
    again = _facts(plugins=("repeat",), repeat=(2, "function"))
    assert again.plugin_options() == ["-p", "repeat", "--count=2", "--repeat-scope=function"]
    assert _facts().plugin_options() == []
