"""Selection + compression overhead against the compute step, side by side, one CPU thread.

    .venv/bin/python testbed/bench_selection.py [--model resnet18] [--batch 32] [--world 2]

Measures, in one process and one run: the model's forward+backward time for one
batch (the compute step), then for each density the sparse path's per-step work
on a gradient of the model's size: error feedback + exact TopK + packing
(``select``) and building the averaged gradient from every rank's chunk
(``decode``), on the fused kernels (native) and on eager PyTorch. Prints the
overhead as a fraction of the compute step (issue #2's target: <= 25% at
density 0.01 to 0.1). Times are medians of --repeats runs after a warm-up.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from netsense.compression import native
from netsense.compression.memory import ResidualMemory
from netsense.compression.selection import Workspace, topk_indices
from netsense.train.models import build_model


def median_seconds(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def compute_step(model_name: str, batch: int, repeats: int) -> tuple[float, int]:
    model = build_model(model_name, (3, 32, 32), 100)
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 100, (batch,))

    def step():
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()

    return median_seconds(step, repeats), sum(p.numel() for p in model.parameters())


def torch_path(residual, grad, k, gen, ws, world):
    signal = residual.add_(grad)
    idx = topk_indices(torch.abs(signal, out=ws.get("m", signal.numel(), signal.dtype, signal.device)), k, gen, ws)
    values = signal[idx].half()
    ResidualMemory.sent(signal, idx, values)
    packed = torch.cat([idx.to(torch.int32).view(torch.uint8), values.view(torch.uint8)])
    return [packed] * world


def torch_decode(buf, chunks, k, world):
    buf.zero_()
    for c in chunks:
        buf.index_add_(0, c[:4 * k].view(torch.int32).long(), c[4 * k:].view(torch.float16).float().div_(world))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--world", type=int, default=2, help="ranks whose chunks are decoded")
    ap.add_argument("--densities", default="0.001,0.01,0.05,0.1")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if native.library() is None:
        raise SystemExit("the native kernels are unavailable; see the message above")
    step, n = compute_step(args.model, args.batch, args.repeats)
    print(f"{args.model}: {n / 1e6:.1f}M parameters, compute step (fwd+bwd, batch {args.batch}) "
          f"{step * 1e3:.0f} ms, one thread")
    print(f"{'density':>8} {'path':>8} {'select ms':>10} {'decode ms':>10} {'total ms':>9} {'x step':>7}")
    gen = torch.Generator().manual_seed(0)
    grad = torch.randn(n, generator=gen)
    buf = torch.zeros(n)
    for density in (float(d) for d in args.densities.split(",")):
        for path, s, d in measure(math.ceil(density * n), grad, buf, gen, args.world, args.repeats):
            print(f"{density:>8g} {path:>8} {s * 1e3:>10.1f} {d * 1e3:>10.1f} {(s + d) * 1e3:>9.1f} "
                  f"{(s + d) / step:>7.2f}")


def measure(k, grad, buf, gen, world, repeats):
    """(path, select seconds, decode seconds) for the native and the PyTorch path."""
    n = grad.numel()
    residual = torch.zeros(n)
    selector = native.Selector()
    chunks = [selector.select(residual, grad, k, True, True, gen)] * world
    sel_native = median_seconds(lambda: selector.select(residual, grad, k, True, True, gen), repeats)
    dec_native = median_seconds(lambda: native.decode(buf, chunks, k, True, world), repeats)
    ws, residual_t = Workspace(), torch.zeros(n)
    sel_torch = median_seconds(lambda: torch_path(residual_t, grad, k, gen, ws, world), repeats)
    chunks_t = torch_path(residual_t, grad, k, gen, ws, world)
    dec_torch = median_seconds(lambda: torch_decode(buf, chunks_t, k, world), repeats)
    return [("native", sel_native, dec_native), ("pytorch", sel_torch, dec_torch)]

if __name__ == "__main__":
    main()
