"""The deployment files say what the code does: every process in compose.yaml is a real command."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

from flaketriage.cli import app

INFRA = Path(__file__).resolve().parents[1] / "infra"


def compose() -> dict[str, dict[str, object]]:
    services: dict[str, dict[str, object]] = yaml.safe_load((INFRA / "compose.yaml").read_text())["services"]
    return services


def test_the_stack_has_every_part_of_the_service() -> None:
    services = compose()
    assert {"receiver", "worker", "gpu-worker", "beat", "postgres", "redis"} <= set(services)
    gpu = services["gpu-worker"]["deploy"]["resources"]["reservations"]["devices"][0]  # type: ignore[index]
    assert gpu["capabilities"] == ["gpu"]


def test_every_flaketriage_command_in_the_stack_parses() -> None:
    runner = CliRunner()
    for name, service in compose().items():
        command = service.get("command")
        if not isinstance(command, list) or command[0] != "flaketriage":
            continue
        # --help after the real options: the options must parse, and nothing starts.
        result = runner.invoke(app, [*[str(c) for c in command[1:]], "--help"])
        assert result.exit_code == 0, (name, result.output)


def test_the_worker_services_take_the_queues_they_are_for() -> None:
    services = compose()
    assert "gpu" in services["gpu-worker"]["command"]  # type: ignore[operator]
    assert "cpu,report" in services["worker"]["command"]  # type: ignore[operator]
