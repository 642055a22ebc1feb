"""The replay variables: what the replayer sets is what the plugin, the guards and sitecustomize read."""

from __future__ import annotations

import subprocess
import sys

import pytest

from flaketriage.ci import pytest_plugin
from flaketriage.process.replay_env import (
    DETERMINISTIC_ENV,
    DETERMINISTIC_SETTINGS,
    REPLAY_ENV,
    REPLAY_SETTINGS,
    in_replay,
)
from flaketriage.workers.replay import SITECUSTOMIZE_DIR


def test_a_replay_sets_the_variable_and_the_deterministic_settings() -> None:
    assert REPLAY_SETTINGS == {**DETERMINISTIC_SETTINGS, REPLAY_ENV: "1"}
    assert in_replay(REPLAY_SETTINGS)
    assert not in_replay({}) and not in_replay({REPLAY_ENV: "0"})


def test_the_plugin_and_the_guards_both_stand_down_in_a_replay(
    monkeypatch: pytest.MonkeyPatch, pytestconfig: pytest.Config
) -> None:
    evidence = pytest.importorskip("flaketriage.guards.evidence")  # needs torch
    asked = {pytest_plugin.ENABLE_ENV: "1"}
    monkeypatch.delenv(REPLAY_ENV, raising=False)
    assert pytest_plugin.enabled(pytestconfig, asked) and not evidence.replaying()
    for name, value in REPLAY_SETTINGS.items():
        monkeypatch.setenv(name, value)
    assert not pytest_plugin.enabled(pytestconfig, {**asked, **REPLAY_SETTINGS})
    assert evidence.replaying()


def test_sitecustomize_spells_the_switch_as_the_constant() -> None:
    # It runs where flaketriage may not be importable, so it writes the name out.
    source = (SITECUSTOMIZE_DIR / "sitecustomize.py").read_text()
    assert f'os.environ.get("{DETERMINISTIC_ENV}", "1")' in source


def test_importing_it_costs_only_the_standard_library() -> None:
    # The pytest plugin imports it at start-up, before any failure.
    code = (
        "import sys; before = set(sys.modules); import flaketriage.process.replay_env; "
        "new = {m.split('.')[0] for m in set(sys.modules) - before}; "
        "print(sorted(new - set(sys.stdlib_module_names) - {'flaketriage'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
