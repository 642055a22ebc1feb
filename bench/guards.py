"""Numeric guard overhead: step time of an unguarded loop, the common per-parameter check, NumericGuard,
and torch.autograd.detect_anomaly, on an MLP and a small transformer (>= 10M parameters).

Each variant trains its own copy of the model (same initial weights, same batches, Adam). Steps are
interleaved round-robin after a warm-up (in a fresh random order every round), so drift in machine
load hits every variant alike; a second unguarded loop (A/A) runs in every round too. The figure
is the per-block ratio: a variant's time over a block of 32 consecutive rounds divided by the
unguarded loop's time over the same rounds (32 rounds hold exactly the guard's periodic full passes
on the CPU, every 8 and 32 steps, so no statistic can hide them), as the median over the blocks
with its quartiles and range. The A/A blocks give the noise floor: an overhead whose median is
within it is printed "within noise (< X%)". "N times less overhead" is judged from the 95%
confidence intervals of the medians (order statistics, narrowing as blocks are added): the
per-parameter pattern's overhead at its lowest over the guard's at its highest, or over this run's
resolution (half the A/A interval's width) when the guard's is below it, never over an overhead
of about zero.
Goals: NumericGuard's median block ratio <= 1.03x on the CPU (<= 1.01x on a GPU, with zero host
syncs added per step), and at least 10x less overhead than the per-parameter pattern. On CUDA,
host syncs per step are counted with ``torch.cuda.set_sync_debug_mode("warn")`` in a separate,
untimed pass. Exits 1 on a miss.

One intra-op thread by default: on a machine other processes share, two threads wait for each
other at every barrier whenever one is descheduled (on this project's loaded 2-core VM a step then
took 9x longer, and the noise grew with it); ``--threads 2`` on an idle machine.

    python bench/guards.py [--quick] [--device cpu|cuda] [--threads 1] [--blocks N] [--only mlp]
"""

from __future__ import annotations

import argparse
import copy
import math
import random
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from goals import check
from paired import Spread, noise_floor, overhead_text

from flaketriage.guards import NumericGuard

VARIANTS = ("unguarded", "unguarded (A/A)", "per-parameter", "NumericGuard", "detect_anomaly")
"""``unguarded (A/A)`` is a second, identical unguarded loop: its ratio shows the measurement noise."""
BLOCK = 32
"""Rounds per block: a multiple of the guard's CPU periods (grad_every=8, param_every=32)."""
REPEATS = 3


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


def measure(work: Workload, device: torch.device, warmup: int, blocks: int) -> dict[str, list[float]]:
    """`blocks` blocks of `BLOCK` timed rounds per variant, split over `REPEATS` fresh sets of
    runners: identical models can differ by a few percent from where their tensors landed in
    memory, and new allocations (made in a new order each time) average that out. A block never
    spans two sets of runners, so each holds exactly one of the guard's periodic cycles."""
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    order = random.Random(0)
    per_repeat = [blocks // REPEATS + (i < blocks % REPEATS) for i in range(REPEATS)]
    for repeat_blocks in per_repeat:
        if not repeat_blocks:
            continue
        runners = [Runner(v, work) for v in order.sample(VARIANTS, len(VARIANTS))]
        for round_ in range(warmup + repeat_blocks * BLOCK):
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


def block_ratios(times: list[float], base: list[float]) -> Spread:
    """Per block of `BLOCK` rounds: the variant's time over the unguarded loop's in the same rounds."""
    return Spread(
        tuple(
            sum(times[i : i + BLOCK]) / sum(base[i : i + BLOCK])
            for i in range(0, len(base) - BLOCK + 1, BLOCK)
        )
    )


def report(
    work: Workload, times: dict[str, list[float]], syncs: dict[str, float] | None, goal: float
) -> bool:
    base = times["unguarded"]
    params = sum(p.numel() for p in work.model.parameters())
    blocks = len(base) // BLOCK
    print(
        f"\n{work.name}: {params / 1e6:.1f}M parameters, {len(base)} interleaved rounds "
        f"({blocks} blocks of {BLOCK})"
    )
    ratios = {v: block_ratios(times[v], base) for v in VARIANTS if v != "unguarded"}
    noise = noise_floor(ratios["unguarded (A/A)"])
    header = f"  {'variant':<16}{'median ms':>10}  {'block ratio: median (IQR, range)':<48}{'overhead':<24}"
    print(header + ("syncs/step" if syncs else ""))
    for variant in VARIANTS:
        median_ms = statistics.median(times[variant]) * 1e3
        if variant == "unguarded":
            cells = f"{'(baseline)':<48}{'':<24}"
        elif variant == "unguarded (A/A)":
            cells = f"{ratios[variant].ratio_text():<48}{f'noise floor ±{noise:.1%}':<24}"
        else:
            cells = f"{ratios[variant].ratio_text():<48}{overhead_text(ratios[variant], noise):<24}"
        line = f"  {variant:<16}{median_ms:>10.2f}  {cells}"
        if syncs:
            line += f"{syncs[variant]:>10.1f}"
        print(line)
    guard, per_param = ratios["NumericGuard"], ratios["per-parameter"]
    # "N times less" from the 95% intervals of the medians (paired.Spread.median_interval): the
    # per-parameter pattern's overhead at its lowest over the guard's at its highest. A guard whose
    # highest is below what this run can resolve at all (half the A/A interval's width) is held to
    # that resolution instead: dividing by an overhead of about zero would print noise, or infinity.
    aa_low, aa_high = ratios["unguarded (A/A)"].median_interval()
    resolution = (aa_high - aa_low) / 2
    guard_high = guard.median_interval()[1] - 1
    per_param_low = per_param.median_interval()[0] - 1
    bound = max(guard_high, resolution)
    times_more = per_param_low / bound if bound > 0 else math.inf
    less = (
        f"per-parameter at least {per_param_low:+.1%}, guard at most {guard_high:+.1%}"
        f"{f' (below the resolution ±{resolution:.1%})' if guard_high < resolution else ''}, 95% intervals"
    )
    print()
    results = [
        check(
            f"{work.name}: NumericGuard median block ratio [{overhead_text(guard, noise)}]",
            f"{guard.median:.3f}x",
            "<=",
            f"{goal:.2f}x",
            guard.median <= goal,
        ),
        check(
            f"{work.name}: less overhead than per-parameter [{less}]",
            f"{times_more:.1f}x",
            ">=",
            "10x",
            times_more >= 10,
        ),
    ]
    if syncs:
        added = syncs["NumericGuard"] - syncs["unguarded"]
        results.append(
            check(f"{work.name}: host syncs added per step", f"{added:+.1f}", "<=", "0", added <= 0)
        )
    return all(results)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (CPU)")
    parser.add_argument("--blocks", type=int, default=None, help=f"blocks of {BLOCK} rounds per model")
    parser.add_argument("--quick", action="store_true", help="fewer blocks: a smoke run, noisier")
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
    results: list[bool] = []
    builders = {"mlp": mlp, "transformer": transformer}
    for name, build in builders.items():
        if args.only and name != args.only:
            continue
        work = build(device)
        cheap = name == "mlp" or device.type == "cuda"
        # At least 11 blocks in a full run: fewer, and a median's 95% interval is the whole range.
        blocks = args.blocks or ((6 if cheap else 2) if args.quick else (18 if cheap else 11))
        warmup = 10 if cheap else 4
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # detect_anomaly warns on every use
            times = measure(work, device, warmup, blocks)
            syncs = count_syncs(work) if device.type == "cuda" else None
        results.append(report(work, times, syncs, goal))
    print(
        "\n  block ratio: a variant's time over 32 rounds / the unguarded loop's over the same rounds;"
        "\n  noise floor: how far the A/A blocks' quartiles stray from 1.0. An overhead within it is"
        "\n  not a number this machine can measure."
    )
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
