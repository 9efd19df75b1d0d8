"""Selection + compression overhead against the compute step, side by side, one CPU thread or one GPU.

    .venv/bin/python testbed/bench_selection.py [--model resnet18,vgg16] [--batch 32] [--world 2]
        [--device cpu|cuda] [--json out.json]

Measures, in one process and one run: the model's forward+backward time for one
batch (the compute step), then for each density the sparse path's per-step work
on a gradient of the model's size: error feedback + exact TopK + packing
(``select``) and building the averaged gradient from every rank's chunk
(``decode``), on the fused kernels (native) and on eager PyTorch. Prints the
overhead as a fraction of the compute step (issue #2's target: <= 25% at
density 0.01 to 0.1). Times are medians of --repeats runs after a warm-up.
On --device cuda everything runs on the GPU and each timed run ends with a
device synchronize (CUDA calls return before the work is done); the fused
kernels are CPU code, so only the PyTorch path is measured there.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import torch

from netsense.compression import native
from netsense.compression.memory import ResidualMemory
from netsense.compression.selection import Workspace, topk_indices
from netsense.train.models import build_model


def median_seconds(fn, repeats: int, device: str = "cpu") -> float:
    def run():
        fn()
        if device == "cuda":
            torch.cuda.synchronize()

    run()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def compute_step(model_name: str, batch: int, repeats: int, device: str = "cpu") -> tuple[float, int]:
    model = build_model(model_name, (3, 32, 32), 100).to(device)
    x, y = torch.randn(batch, 3, 32, 32, device=device), torch.randint(0, 100, (batch,), device=device)

    def step():
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()

    return median_seconds(step, repeats, device), sum(p.numel() for p in model.parameters())


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
    ap.add_argument("--model", default="resnet18", help="one model or several, comma-separated")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--world", type=int, default=2, help="ranks whose chunks are decoded")
    ap.add_argument("--densities", default="0.001,0.01,0.05,0.1")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device here")
    if args.device == "cpu" and native.library() is None:
        print("the native kernels are unavailable (see the message above): the PyTorch path only")
    where = torch.cuda.get_device_name() if args.device == "cuda" else "one CPU thread"
    rows = []
    for model in args.model.split(","):
        step, n = compute_step(model, args.batch, args.repeats, args.device)
        print(f"{model}: {n / 1e6:.1f}M parameters, compute step (fwd+bwd, batch {args.batch}) "
              f"{step * 1e3:.1f} ms, {where}")
        print(f"{'density':>8} {'path':>8} {'select ms':>10} {'decode ms':>10} {'total ms':>9} {'x step':>7}")
        gen = torch.Generator(device=args.device).manual_seed(0)
        grad = torch.randn(n, generator=gen, device=args.device)
        buf = torch.zeros(n, device=args.device)
        for density in (float(d) for d in args.densities.split(",")):
            for path, s, d in measure(math.ceil(density * n), grad, buf, gen, args.world, args.repeats):
                print(f"{density:>8g} {path:>8} {s * 1e3:>10.2f} {d * 1e3:>10.2f} {(s + d) * 1e3:>9.2f} "
                      f"{(s + d) / step:>7.3f}")
                rows.append({"model": model, "parameters": n, "device": where, "batch": args.batch,
                             "compute_step_ms": round(step * 1e3, 3), "density": density, "path": path,
                             "select_ms": round(s * 1e3, 3), "decode_ms": round(d * 1e3, 3),
                             "overhead_x_step": round((s + d) / step, 4)})
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


def measure(k, grad, buf, gen, world, repeats):
    """(path, select seconds, decode seconds) for the native path (CPU, where built) and the PyTorch path."""
    n, device = grad.numel(), grad.device.type
    out = []
    if device == "cpu" and native.library() is not None:
        residual = torch.zeros(n)
        selector = native.Selector()
        chunks = [selector.select(residual, grad, k, True, True, gen)] * world
        sel_native = median_seconds(lambda: selector.select(residual, grad, k, True, True, gen), repeats)
        dec_native = median_seconds(lambda: native.decode(buf, chunks, k, True, world), repeats)
        out.append(("native", sel_native, dec_native))
    ws, residual_t = Workspace(), torch.zeros(n, device=grad.device)
    sel_torch = median_seconds(lambda: torch_path(residual_t, grad, k, gen, ws, world), repeats, device)
    chunks_t = torch_path(residual_t, grad, k, gen, ws, world)
    dec_torch = median_seconds(lambda: torch_decode(buf, chunks_t, k, world), repeats, device)
    return out + [("pytorch", sel_torch, dec_torch)]


if __name__ == "__main__":
    main()
