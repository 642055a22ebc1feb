"""Telemetry runs: a failure that did not reproduce, replayed longer while the machine is watched.

A telemetry run replays a bundle under a stricter policy than triage's (it looks for rarer flakes,
so it needs more clean replays to give up: `telemetry_policy`) and a longer time limit per replay,
while a `Sampler` records the host and the GPUs at a fixed interval. Then one more replay runs
under a profiler, outside the verdict (a profiler changes what the run prints and how it exits):
the torch profiler when the bundle uses torch (a Chrome trace, through the replay's
``sitecustomize``), else ``py-spy record`` when it is installed (speedscope JSON). The time series
and the profile are stored as objects in the store; the result references them and carries a
summary, which the report shows (`flaketriage.workers.samplers.summary_lines`).

``flaketriage telemetry BUNDLE`` runs one on this machine; the service's beat schedules one per
``not_reproduced`` case (`Pipeline.telemetry`). Both run this class.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flaketriage.bundle.manifest import Manifest
from flaketriage.errors import FlaketriageError
from flaketriage.store import Store
from flaketriage.workers.replay import Replayer, Variant
from flaketriage.workers.samplers import HostProbe, NvmlProbe, Sampler, summarize
from flaketriage.workers.triage import ProgressFn, SequentialReplays, TriageResult
from flaketriage.workers.verdict import VerdictPolicy

TORCH_PROFILE_ENV = "FLAKETRIAGE_TORCH_PROFILE"
"""Where the replay's ``sitecustomize`` writes the torch profiler's Chrome trace."""
TORCH_TRACE = ".flaketriage-torch-trace.json"
PY_SPY_PROFILE = ".flaketriage-py-spy.speedscope.json"


def telemetry_policy(base: VerdictPolicy, factor: float) -> VerdictPolicy:
    """`base` looking for flakes `factor` times rarer, with `factor` times the replays to spend.

    With the defaults (5% and 3×) a failure must now stay away for 179 replays instead of 59 to
    be ``not_reproduced``: one that fails 1 time in 60 would still show itself 95 times in 100.
    """
    return VerdictPolicy(
        min_rate=min(base.min_rate / factor, base.max_rate),
        max_rate=base.max_rate,
        alpha=base.alpha,
        max_replays=max(base.max_replays, round(base.max_replays * factor)),
        confidence=base.confidence,
        flaky_rate_replays=base.flaky_rate_replays,
    )


def uses_torch(manifest: Manifest) -> bool:
    """Whether the captured run had torch installed (or reported a torch seed)."""
    names = {pin.partition("==")[0].strip().lower() for pin in manifest.environment.packages}
    return "torch" in names or "torch" in manifest.seeds.values


@dataclass(frozen=True)
class Profile:
    tool: str
    format: str
    data: bytes


class TelemetryRun:
    """One telemetry run of the bundle `replayer` replays; its objects go to `store`."""

    def __init__(
        self,
        store: Store,
        replayer: Replayer,
        policy: VerdictPolicy,
        *,
        interval_s: float = 1.0,
        profile: bool = True,
        gpus: NvmlProbe | None = None,
        host: HostProbe | None = None,
        progress: ProgressFn | None = None,
    ) -> None:
        self.store = store
        self.replayer = replayer
        self.policy = policy
        self.interval_s = interval_s
        self.profile = profile
        self._gpus = gpus
        self._host = host
        self.progress = progress

    def run(self) -> TriageResult:
        manifest = self.replayer.manifest
        gpus = self._gpus if self._gpus is not None else NvmlProbe.open()
        try:
            sampler = Sampler(self.interval_s, host=self._host, gpus=gpus)
            replays = SequentialReplays(self.replayer, self.policy, self.progress)
            with sampler:
                replays.run()
                profile, note = self._profile(manifest) if self.profile else (None, "not asked for")
            samples = sampler.samples
        finally:
            if gpus is not None and self._gpus is None:
                gpus.close()
        summary = summarize(
            samples,
            interval_s=self.interval_s,
            host_source=sampler.host.source,
            devices=gpus.devices if gpus is not None else (),
            driver=gpus.driver if gpus is not None else None,
        )
        series = self.store.put_bytes(
            b"".join(json.dumps(s, sort_keys=True).encode() + b"\n" for s in samples)
        )
        telemetry: dict[str, Any] = {
            "summary": summary,
            "series": {"object": series.sha256, "size": series.size, "format": "jsonl"},
            "profile": None,
            "profile_note": note,
        }
        if profile is not None:
            ref = self.store.put_bytes(profile.data)
            telemetry["profile"] = {
                "object": ref.sha256,
                "size": ref.size,
                "tool": profile.tool,
                "format": profile.format,
            }
        return TriageResult(
            bundle_id=manifest.bundle_id,
            verdict=replays.test.result(),
            findings=replays.findings,
            hang=replays.hang,
            telemetry=telemetry,
        )

    def _profile(self, manifest: Manifest) -> tuple[Profile | None, str | None]:
        """One profiled replay (not counted in the verdict), and why there is none when there is none."""
        if self.progress:
            self.progress("profiling one more replay", 0, 0)
        if uses_torch(manifest):
            found = self._replay_for(Variant(env={TORCH_PROFILE_ENV: TORCH_TRACE}, artifacts=[TORCH_TRACE]))
            if found is not None:
                return Profile("torch.profiler", "chrome-trace", found), None
        py_spy = shutil.which("py-spy")
        if py_spy is None:
            why = "py-spy is not installed (pip install py-spy)"
            return None, why + (" and the run never imported torch" if uses_torch(manifest) else "")
        argv = [py_spy, "record", "--format", "speedscope", "--output", PY_SPY_PROFILE, "--subprocesses"]
        found = self._replay_for(
            Variant(argv=[*argv, "--", *manifest.command.argv], artifacts=[PY_SPY_PROFILE])
        )
        if found is None:
            return None, "py-spy wrote no profile (it may lack ptrace permission here)"
        return Profile("py-spy", "speedscope", found), None

    def _replay_for(self, variant: Variant) -> bytes | None:
        names: Sequence[str] = variant.artifacts
        try:
            result = self.replayer.run(variant)
        except FlaketriageError:
            return None  # the profile is extra evidence: the run's verdict stands without it
        return next((result.artifacts[n] for n in names if result.artifacts.get(n)), None)
