"""The FP32-vs-AMP drift check: train a few steps both ways and compare losses and activations.

Mixed precision is safe for a model whose activations stay well scaled; a model that sums large
magnitudes, subtracts nearly equal numbers or exponentiates large logits loses its answer in
bfloat16's 8-bit or float16's 11-bit mantissa. Running the same steps from the same weights in
both precisions and comparing the per-module activation statistics names the module where that
happens, before a long training run finds out.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flaketriage.testing import arrays
from flaketriage.testing.failure import Context, MLAssertionError, versions_description
from flaketriage.testing.finiteness import module_outputs

if TYPE_CHECKING:
    import torch
    from torch import nn

    LossFn = Callable[[nn.Module, Any], torch.Tensor]
    OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]

STATS = ("mean", "std", "absmax")

TINY = 1e-12
"""Floor of every scale a drift is divided by, so an all-zero activation cannot divide by zero."""

ROOT = "(model)"
"""How the table names the model itself, whose dotted module name is empty."""


@dataclass(frozen=True)
class ModuleDrift:
    """The largest drift of one module's output: which statistic, at which step, how far."""

    module: str
    kind: str
    """The module's class name."""
    stat: str
    step: int
    fp32: float
    amp: float
    drift: float
    """``|amp - fp32|`` over the activation's FP32 scale (std for mean and std, absmax for
    absmax); ``inf`` when exactly one of the two is not finite."""


@dataclass(frozen=True)
class DriftReport:
    """What :func:`assert_amp_drift_within` measured; returned when the drift is within tolerance."""

    dtype: str
    device: str
    steps: int
    fp32_losses: tuple[float, ...]
    amp_losses: tuple[float, ...]
    loss_rtol: float
    act_rtol: float
    modules: tuple[ModuleDrift, ...] = field(default=())
    """Each module's largest drift, the worst first."""

    @property
    def loss_drift(self) -> float:
        return max(_relative(a, b, abs(a)) for a, b in zip(self.fp32_losses, self.amp_losses, strict=True))

    @property
    def activation_drift(self) -> float:
        return self.modules[0].drift if self.modules else 0.0

    @property
    def within(self) -> bool:
        return self.loss_drift <= self.loss_rtol and self.activation_drift <= self.act_rtol

    def table(self, limit: int = 10) -> str:
        """The losses per step and the ``limit`` worst-drifting modules, as aligned text."""
        lines = [f"loss per step (loss_rtol {self.loss_rtol:g}):", _row("step", "fp32", "amp", "drift")]
        for step, (a, b) in enumerate(zip(self.fp32_losses, self.amp_losses, strict=True)):
            lines.append(_row(str(step), _num(a), _num(b), _flag(_relative(a, b, abs(a)), self.loss_rtol)))
        shown = self.modules[:limit]
        lines.append(
            f"activations, worst {len(shown)} of {len(self.modules)} modules (act_rtol {self.act_rtol:g}):"
        )
        width = max([len("module"), *(len(m.module) for m in shown)])
        lines.append(
            f"  {'module':<{width}}  {'type':<16} {'stat':<7}" + _row("step", "fp32", "amp", "drift")[2:]
        )
        for m in shown:
            lines.append(
                f"  {m.module:<{width}}  {m.kind:<16} {m.stat:<7}"
                + _row(str(m.step), _num(m.fp32), _num(m.amp), _flag(m.drift, self.act_rtol))[2:]
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        head = f"FP32 vs AMP ({self.dtype} autocast on {self.device}) over {self.steps} steps"
        return f"{head}\n{self.table()}"


class AmpDriftError(MLAssertionError):
    """Training under autocast drifted from FP32 beyond the tolerances; ``report`` has the numbers."""

    def __init__(self, message: str, report: DriftReport | None = None) -> None:
        super().__init__(message)
        self.report = report


def assert_amp_drift_within(
    model_factory: Callable[[], nn.Module] | nn.Module,
    batches: Iterable[Any],
    *,
    steps: int = 3,
    loss_rtol: float = 0.05,
    act_rtol: float = 0.1,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    loss_fn: LossFn | None = None,
    optimizer_factory: OptimizerFactory | None = None,
    seed: int = 0,
    context: Context = None,
) -> DriftReport:
    """Train ``steps`` steps in FP32 and under ``torch.autocast`` from the same weights; fail when
    they drift apart.

    ``model_factory`` is called once under ``torch.manual_seed(seed)`` (or a module is taken as
    it is) and each run trains its own deep copy, so both start from the same weights; each step
    reseeds torch with ``seed + step`` so dropout draws the same masks, and the caller's RNG state
    is restored afterwards. Step ``i`` uses ``batches[i % len(batches)]``.

    A batch ``(inputs, targets)`` is scored with cross-entropy when ``targets`` are integers and
    mean squared error otherwise; any other batch goes to the model, which must return the loss.
    Pass ``loss_fn(model, batch)`` for anything else. The optimizer defaults to SGD with
    ``lr=0.01``; float16 steps go through a ``GradScaler``, as in real AMP training.

    ``dtype`` defaults to bfloat16 on the CPU and float16 on CUDA; ``device`` to the model's.
    Forward hooks record each module's output mean, std and absmax per step. The drift of a loss is
    relative to the FP32 loss; that of an activation statistic relative to the FP32 activation's
    scale (its std, or its mean when larger, for mean and std; its absmax for absmax). The defaults
    leave room for bfloat16's rounding (2⁻⁹ relative per op) compounding over a few layers and steps;
    optimizers that normalize the step size (Adam) turn gradient rounding into full-size updates, so
    later steps drift more than the first: loosen ``act_rtol``, or check the forward pass alone with
    ``steps=1``.

    Returns a :class:`DriftReport`; raises :class:`AmpDriftError` with a table of the losses and the
    worst-drifting modules when ``loss_rtol`` or ``act_rtol`` is exceeded.
    """
    th = arrays.torch()
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    data = list(batches)
    if not data:
        raise ValueError("batches is empty; the drift check needs at least one batch to train on")
    with _isolated_rng(th, seed):
        base = model_factory if isinstance(model_factory, th.nn.Module) else model_factory()
    where = th.device(device) if device is not None else _device_of(base)
    precision = dtype or (th.float16 if where.type == "cuda" else th.bfloat16)
    run = _Run(where, data, steps, loss_fn or _default_loss, optimizer_factory or _sgd, seed)
    with _full_fp32(th):
        fp32 = run.train(copy.deepcopy(base), None)
    amp = run.train(copy.deepcopy(base), precision)
    report = DriftReport(
        dtype=str(precision),
        device=str(where),
        steps=steps,
        fp32_losses=tuple(fp32.losses),
        amp_losses=tuple(amp.losses),
        loss_rtol=loss_rtol,
        act_rtol=act_rtol,
        modules=_module_drifts(fp32, amp),
    )
    if not report.within:
        raise AmpDriftError(
            f"AMP drifts from FP32 beyond tolerance: {report}\n{versions_description(context)}", report
        )
    return report


@dataclass
class _Trace:
    """One run's losses, and each module's output statistics, per step."""

    losses: list[float] = field(default_factory=list)
    stats: dict[str, dict[int, tuple[float, float, float]]] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)
    step: int = 0
    calls: dict[str, int] = field(default_factory=dict)
    """How often each module ran in this step, so a module called twice is recorded twice."""

    def begin(self, step: int) -> None:
        self.step = step
        self.calls.clear()

    def record(self, name: str, module: nn.Module, output: Any) -> None:
        for suffix, tensor in _floating_outputs(output):
            key = f"{name}{suffix}"
            self.calls[key] = self.calls.get(key, 0) + 1
            if self.calls[key] > 1:
                key = f"{key}#{self.calls[key]}"
            self.kinds.setdefault(key, type(module).__name__)
            self.stats.setdefault(key, {})[self.step] = _statistics(tensor)


@dataclass(frozen=True)
class _Run:
    device: torch.device
    batches: Sequence[Any]
    steps: int
    loss_fn: LossFn
    optimizer_factory: OptimizerFactory
    seed: int

    def train(self, model: nn.Module, precision: torch.dtype | None) -> _Trace:
        th = arrays.torch()
        model.to(self.device).train()
        optimizer = self.optimizer_factory(model.parameters())
        scaler = th.amp.GradScaler(self.device.type) if precision == th.float16 else None
        trace = _Trace()
        with module_outputs(model, lambda name, module, output: trace.record(name or ROOT, module, output)):
            for step in range(self.steps):
                trace.begin(step)
                batch = _to_device(self.batches[step % len(self.batches)], self.device)
                with _isolated_rng(th, self.seed + step, self.device):
                    with th.autocast(self.device.type, dtype=precision, enabled=precision is not None):
                        loss = self.loss_fn(model, batch)
                    optimizer.zero_grad(set_to_none=True)
                    if scaler is None:
                        th.autograd.backward(loss)
                        optimizer.step()
                    else:
                        scaler.scale(loss).backward()
                        scaler.step(optimizer)
                        scaler.update()
                trace.losses.append(float(loss.detach().float()))
        return trace


def _floating_outputs(output: Any, suffix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    th = arrays.torch()
    if isinstance(output, th.Tensor):
        if output.is_floating_point():
            yield suffix, output
    elif isinstance(output, tuple | list):
        for i, item in enumerate(output):
            yield from _floating_outputs(item, f"{suffix}[{i}]")
    elif isinstance(output, dict):
        for key, item in output.items():
            yield from _floating_outputs(item, f"{suffix}[{key!r}]")


def _statistics(tensor: torch.Tensor) -> tuple[float, float, float]:
    th = arrays.torch()
    values = tensor.detach().double()
    if values.numel() == 0:
        return (0.0, 0.0, 0.0)
    std = values.std(unbiased=False)
    mean, std_value, absmax = th.stack([values.mean(), std, values.abs().max()]).tolist()
    return (float(mean), float(std_value), float(absmax))


def _module_drifts(fp32: _Trace, amp: _Trace) -> tuple[ModuleDrift, ...]:
    """Each module's largest drift over its statistics and steps, the worst module first.

    A module the AMP run never reached (an exception, a data-dependent branch) counts as drifting
    without bound at its first missing step.
    """
    worst: list[ModuleDrift] = []
    for name, per_step in fp32.stats.items():
        candidates = []
        for step, reference in per_step.items():
            got = amp.stats.get(name, {}).get(step, (math.nan, math.nan, math.nan))
            mean, std, absmax = reference
            scales = (max(std, abs(mean)), std, absmax)
            for stat, a, b, scale in zip(STATS, reference, got, scales, strict=True):
                candidates.append(
                    ModuleDrift(name, fp32.kinds[name], stat, step, a, b, _relative(a, b, scale))
                )
        worst.append(max(candidates, key=lambda d: d.drift))
    # Among equal drifts (often all infinite once a NaN spreads) the earliest step comes first, and
    # within it the module that ran first: where the NaN appeared.
    return tuple(sorted(worst, key=lambda d: (-d.drift, d.step)))


def _relative(reference: float, value: float, scale: float) -> float:
    if not (math.isfinite(reference) and math.isfinite(value)):
        return 0.0 if reference == value else math.inf
    return abs(value - reference) / max(scale, TINY)


def _default_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    th = arrays.torch()
    if isinstance(batch, tuple | list) and len(batch) == 2:
        inputs, targets = batch
        output = model(inputs)
        functional = th.nn.functional
        if targets.is_floating_point():
            loss: torch.Tensor = functional.mse_loss(output.float(), targets.float())
        else:
            loss = functional.cross_entropy(output.float(), targets)
        return loss
    returned: torch.Tensor = model(batch)
    return returned


def _sgd(parameters: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    return arrays.torch().optim.SGD(parameters, lr=0.01)  # type: ignore[no-any-return]


def _to_device(batch: Any, device: torch.device) -> Any:
    th = arrays.torch()
    if isinstance(batch, th.Tensor):
        return batch.to(device)
    if isinstance(batch, tuple | list):
        return type(batch)(_to_device(item, device) for item in batch)
    if isinstance(batch, dict):
        return {key: _to_device(item, device) for key, item in batch.items()}
    return batch


def _device_of(model: nn.Module) -> torch.device:
    for parameter in model.parameters():
        return parameter.device
    return arrays.torch().device("cpu")  # type: ignore[no-any-return]


@contextmanager
def _isolated_rng(th: Any, seed: int, device: torch.device | None = None) -> Iterator[None]:
    """Seed torch for the block and restore the caller's RNG state after it."""
    devices = [device] if device is not None and device.type == "cuda" else []
    with th.random.fork_rng(devices=devices):
        th.manual_seed(seed)
        yield


@contextmanager
def _full_fp32(th: Any) -> Iterator[None]:
    """FP32 that is FP32: no TF32 in matmuls or cuDNN convolutions (cuDNN allows it by default), so
    the reference run is not itself a reduced-precision one on Ampere and later GPUs."""
    matmul, cudnn = th.get_float32_matmul_precision(), th.backends.cudnn.allow_tf32
    th.set_float32_matmul_precision("highest")
    th.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        th.set_float32_matmul_precision(matmul)
        th.backends.cudnn.allow_tf32 = cudnn


def _row(step: str, fp32: str, amp: str, drift: str) -> str:
    return f"  {step:>4}  {fp32:>14}  {amp:>14}  {drift}"


def _num(value: float) -> str:
    return f"{value:.7g}"


def _flag(drift: float, tolerance: float) -> str:
    return f"{drift:.3g}" + ("  > tolerance" if drift > tolerance else "")
