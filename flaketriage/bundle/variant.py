"""The variant a bundle was captured on (`flaketriage.variant`), read from its manifest.

The same values `current_variant` gives on that machine, so that a quarantine entry written from a
bundle covers the runs of the runner that captured it, and results and quarantine name one variant
alike: ``os`` from the recorded platform, ``python`` (major.minor) from the recorded interpreter,
``gpu`` from the GPUs the capture found (``none`` for none), or from ``FLAKETRIAGE_GPU`` when the
recorded environment sets it (the runner's own statement wins, as it does in the pytest plugin),
then the recorded ``FLAKETRIAGE_VARIANT`` on top.
"""

from __future__ import annotations

from flaketriage.bundle.manifest import Hardware, Manifest
from flaketriage.errors import ConfigError
from flaketriage.variant import (
    GPU_VARIABLE,
    VARIANT_VARIABLE,
    Variant,
    gpu_model_of,
    machine_variant,
    os_of_platform,
)


def variant_of_manifest(manifest: Manifest) -> Variant:
    """The bundle's variant. A part the manifest does not know is left out: no ``gpu`` when its
    hardware was never probed (a manifest with an empty `Hardware`), which is not the same as a
    probe that found no GPU. A recorded ``FLAKETRIAGE_VARIANT`` that does not parse is left out too
    (the run it came from said so when it started)."""
    env = {str(k): str(v) for k, v in manifest.command.env.items()}
    stated = env.get(GPU_VARIABLE)
    if stated is not None:
        gpu: str | None = stated
    elif manifest.hardware == Hardware():
        gpu = None
    else:
        gpu = gpu_model_of(g.name for g in manifest.hardware.gpus)
    parts = {
        "os_name": os_of_platform(manifest.environment.platform),
        "python": manifest.environment.python or None,
        "gpu_model": gpu,
    }
    try:
        return machine_variant(**parts, env=env)
    except ConfigError:
        return machine_variant(**parts, env={k: v for k, v in env.items() if k != VARIANT_VARIABLE})
