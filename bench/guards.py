"""Numeric guard overhead: step time of an unguarded loop, the common per-parameter check, NumericGuard,
and torch.autograd.detect_anomaly, on an MLP and a small transformer (>= 10M parameters).

Each variant trains its own copy of the model (same initial weights, same batches, Adam). Steps are
interleaved round-robin after a warm-up (in a fresh random order every round), so drift in machine load
hits every variant alike. Reported per variant: the median step time and the mean of the fastest
90% of steps (which counts the guard's periodic full passes, every few steps on the CPU, that a
median can hide), each as a ratio to the unguarded loop. NumericGuard runs with its defaults
(capture off: it only matters on a trip). A second unguarded loop (A/A) shows how far two identical
loops differ here: the noise floor of the ratios. Goals, judged on the worse of the two ratios:
NumericGuard <= 1.03x unguarded on the CPU (<= 1.01x on a GPU, with zero host syncs added per
step), and at least 10x less overhead than the per-parameter pattern. On CUDA, host syncs per step
are counted with ``torch.cuda.set_sync_debug_mode("warn")`` in a separate, untimed pass.

    python bench/guards.py [--quick] [--device cpu|cuda] [--threads 2] [--steps N] [--only mlp]
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from flaketriage.guards import NumericGuard

VARIANTS = ("unguarded", "unguarded (A/A)", "per-parameter", "NumericGuard", "detect_anomaly")
"""``unguarded (A/A)`` is a second, identical unguarded loop: its ratio shows the measurement noise."""


@dataclass
class Workload:
    name: str
    model: nn.Module
    batches: list[tuple[torch.Tensor, torch.Tensor]]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def mlp(device: torch.device) -> Workload:
    """4 x 1024 hidden layers, batch 64 (the shape measured in ENVIRONMENT.md)."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(1024, 1024), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(1024, 10)).to(device)
    batches = [
        (torch.randn(64, 1024, device=device), torch.randint(0, 10, (64,), device=device)) for _ in range(4)
    ]
    return Workload("mlp", model, batches, nn.functional.cross_entropy)


class TinyLM(nn.Module):
    """A decoder-style language model: embeddings, 6 pre-norm encoder layers, an output head."""

    def __init__(
        self, vocab: int = 16384, dim: int = 256, layers: int = 6, heads: int = 4, seq: int = 32
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        layer = nn.TransformerEncoderLayer(
            dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.pos[: tokens.shape[1]]
        h = self.blocks(h, mask=self.mask, is_causal=True)
        out: torch.Tensor = self.head(self.norm(h))
        return out


def transformer(device: torch.device) -> Workload:
    torch.manual_seed(0)
    model = TinyLM().to(device)
    batches = []
    for _ in range(4):
        tokens = torch.randint(0, 16384, (4, 33), device=device)
        batches.append((tokens[:, :-1], tokens[:, 1:]))

    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))

    return Workload("transformer", model, batches, loss_fn)


class Runner:
    """One variant: its own model copy and optimizer, and how it checks a step."""

    def __init__(self, variant: str, work: Workload) -> None:
        self.variant = variant
        self.work = work
        self.model = copy.deepcopy(work.model)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-5)
        self.guard = NumericGuard(self.model, self.opt, capture=False) if variant == "NumericGuard" else None
        self.i = 0

    def step(self) -> None:
        x, y = self.work.batches[self.i % len(self.work.batches)]
        self.i += 1
        if self.variant == "detect_anomaly":
            with torch.autograd.detect_anomaly():
                loss = self.work.loss_fn(self.model(x), y)
                torch.autograd.backward(loss)
        else:
            loss = self.work.loss_fn(self.model(x), y)
            if self.guard is not None:
                self.guard.check_loss(loss)
            torch.autograd.backward(loss)
        if self.variant == "per-parameter":
            for name, p in self.model.named_parameters():  # the pattern from the issue
                if p.grad is None:
                    continue
                if not torch.all(torch.isfinite(p.grad)):
                    raise RuntimeError(f"non-finite gradient in {name}")
                if torch.norm(p.grad).item() > 1e6:
                    raise RuntimeError(f"gradient norm of {name} above 1e6")
        self.opt.step()  # the guard's optimizer hook checks the gradients here
        if self.guard is not None:
            self.guard.after_step()
        self.opt.zero_grad(set_to_none=True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(
    work: Workload, device: torch.device, warmup: int, steps: int, repeats: int = 3
) -> dict[str, list[float]]:
    """`steps` timed rounds per variant, split over `repeats` fresh sets of runners: identical
    models can differ by a few percent from where their tensors landed in memory, and new
    allocations (made in a new order each time) average that out."""
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    order = random.Random(0)
    for _ in range(repeats):
        runners = [Runner(v, work) for v in order.sample(VARIANTS, len(VARIANTS))]
        for round_ in range(warmup + steps // repeats):
            # A fresh order each round: no variant always runs first, or after the same neighbour.
            for r in order.sample(runners, len(runners)):
                _sync(device)
                start = time.perf_counter()
                r.step()
                _sync(device)
                if round_ >= warmup:
                    times[r.variant].append(time.perf_counter() - start)
        del runners
    return times


def count_syncs(work: Workload, steps: int = 5) -> dict[str, float]:
    """Host synchronizations per step on CUDA, as torch's sync debug mode reports them."""
    out: dict[str, float] = {}
    for variant in VARIANTS:
        runner = Runner(variant, work)
        for _ in range(3):
            runner.step()
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                for _ in range(steps):
                    runner.step()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        syncs = [w for w in caught if "synchroniz" in str(w.message).lower()]
        out[variant] = len(syncs) / steps
    return out


def _trimmed_mean(values: list[float], cut: float = 0.1) -> float:
    """The mean of the fastest 90%: it counts the guard's periodic full passes (every few steps on
    the CPU), which a median can hide, but not the stalls other processes cause."""
    kept = sorted(values)[: max(1, int(len(values) * (1 - cut)))]
    return sum(kept) / len(kept)


def report(
    work: Workload, times: dict[str, list[float]], syncs: dict[str, float] | None, goal: float
) -> list[tuple[str, bool]]:
    base = times["unguarded"]
    params = sum(p.numel() for p in work.model.parameters())
    print(f"\n{work.name}: {params / 1e6:.1f}M parameters, {len(base)} interleaved steps per variant")
    header = f"  {'variant':<16}{'median ms':>11}{'ratio':>9}{'mean* ms':>11}{'ratio':>9}"
    print(header + ("  syncs/step" if syncs else ""))
    medians: dict[str, float] = {}
    means: dict[str, float] = {}
    for variant in VARIANTS:
        medians[variant] = statistics.median(times[variant]) / statistics.median(base)
        means[variant] = _trimmed_mean(times[variant]) / _trimmed_mean(base)
        line = (
            f"  {variant:<16}{statistics.median(times[variant]) * 1e3:>11.2f}{medians[variant]:>8.3f}x"
            f"{_trimmed_mean(times[variant]) * 1e3:>11.2f}{means[variant]:>8.3f}x"
        )
        if syncs:
            line += f"  {syncs[variant]:>10.1f}"
        print(line)
    # Judged on the statistic that is worse for the guard.
    guard = max(medians["NumericGuard"], means["NumericGuard"])
    less = min(
        (stat["per-parameter"] - 1) / (stat["NumericGuard"] - 1) if stat["NumericGuard"] > 1 else float("inf")
        for stat in (medians, means)
    )
    results = [
        (f"{work.name}: NumericGuard <= {goal:.2f}x unguarded (got {guard:.3f}x)", guard <= goal),
        (
            f"{work.name}: >= 10x less overhead than per-parameter "
            + (f"(got {less:.0f}x)" if less != float("inf") else "(the guard's is below the noise)"),
            less >= 10,
        ),
    ]
    if syncs:
        added = syncs["NumericGuard"] - syncs["unguarded"]
        results.append((f"{work.name}: zero host syncs added per step (got {added:+.1f})", added <= 0))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (CPU)")
    parser.add_argument("--steps", type=int, default=None, help="measured steps per variant")
    parser.add_argument("--quick", action="store_true", help="fewer steps: a smoke run, noisier")
    parser.add_argument("--only", choices=["mlp", "transformer"], default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device is available here")
    goal = 1.03 if device.type == "cpu" else 1.01
    print(f"device {device}, {args.threads} threads, torch {torch.__version__}")
    probe = NumericGuard(nn.Linear(1, 1).to(device), capture=False)
    defaults = f"grad_every={probe.grad_every}, param_every={probe.param_every}, sync={probe.sync}"
    print(f"NumericGuard defaults here: {defaults}")
    probe.close()
    results: list[tuple[str, bool]] = []
    builders = {"mlp": mlp, "transformer": transformer}
    for name, build in builders.items():
        if args.only and name != args.only:
            continue
        work = build(device)
        cheap = name == "mlp" or device.type == "cuda"
        steps = args.steps or ((90 if cheap else 24) if args.quick else (600 if cheap else 150))
        warmup = 10 if cheap else 4
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # detect_anomaly warns on every use
            times = measure(work, device, warmup, steps)
            syncs = count_syncs(work) if device.type == "cuda" else None
        results += report(work, times, syncs, goal)
    print("\n  ratio: to the unguarded loop's statistic; mean*: mean of the fastest 90% of steps.")
    print("  Goals are judged on the worse of the two ratios.\n")
    for text, ok in results:
        print(f"{'PASS' if ok else 'FAIL'}  {text}")
    sys.exit(0 if all(ok for _, ok in results) else 1)


if __name__ == "__main__":
    main()
