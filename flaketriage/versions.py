"""Library version numbers as people read them: cuDNN's and the CUDA driver's packed integers.

Standard library only, so that light importers (``flaketriage.testing``) can format a version
without the manifest or pydantic.
"""

from __future__ import annotations


def format_cudnn_version(version: int) -> str:
    """``torch.backends.cudnn.version()`` as ``major.minor.patch``.

    cuDNN 8 encodes ``major*1000 + minor*100 + patch`` (8902), cuDNN 9 ``major*10000 + minor*100 +
    patch`` (90100).
    """
    major, rest = divmod(version, 10000) if version >= 10000 else divmod(version, 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def format_cuda_driver_version(version: int) -> str:
    """NVML's ``nvmlSystemGetCudaDriverVersion`` (12040) as ``12.4``."""
    return f"{version // 1000}.{version % 1000 // 10}"
