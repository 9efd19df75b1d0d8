"""Selection + compression overhead against the compute step, side by side, one CPU thread or one GPU.

    .venv/bin/python testbed/bench_selection.py [--model resnet18,vgg16] [--batch 32] [--world 2]
        [--device cpu|cuda] [--paths native,pytorch,sampled] [--peak-gbs G] [--json out.json]

Measures, in one process and one run: the model's forward+backward time for one
batch (the compute step), then for each density the sparse path's per-step work
on a gradient of the model's size: error feedback + exact TopK + packing
(``select``) and building the averaged gradient from every rank's chunk
(``decode``), on the fused kernels (native) and on eager PyTorch. Prints the
overhead as a fraction of the compute step (issue #2's target: <= 25% at
density 0.01 to 0.1). Times are medians of --repeats runs after a warm-up.
On --device cuda everything runs on the GPU and each timed run ends with a
device synchronize (CUDA calls return before the work is done); the fused
kernels are CPU code, so only the PyTorch paths are measured there.

Paths, old and new in one run: ``native`` (the fused CPU kernels: the CPU's
default), ``pytorch`` (the exact selection in eager PyTorch: the GPU's default,
with host synchronizations), ``sampled`` (``selection: sampled``:
netsense/compression/sampled.py, fixed sizes and no host synchronization).
Each is also given as bandwidth: the bytes a memory-bound implementation must
move at least, over the time. Selection: the gradient read, the residual read
and written (error feedback), the packed chunk written: 12 n + 6 k bytes (fp16
values). Decode: the bucket written and every rank's chunk read: 4 n + 6 k world.
Against the device's peak: on CUDA 2 x memory clock x bus width (the DRAM's
spec; --peak-gbs overrides), on the CPU a measured copy (one thread, so the
figure is what one core reaches, not the socket's).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import torch

from netsense.compression import native, sampled
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


def sampled_path(residual, grad, k, gen, ws, world):
    n = grad.numel()
    signal = residual.add_(grad)
    packed = sampled.compress(signal, k, True, gen, ws.get("m", n, signal.dtype, signal.device),
                              ws.get("mask", n, torch.bool, signal.device))
    return [packed] * world


def peak_bandwidth(device: str) -> tuple[float, str]:
    """(bytes per second, where the figure comes from) of the device's memory."""
    if device == "cuda":
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        clock_khz, bus_bits = getattr(props, "memory_clock_rate", 0), getattr(props, "memory_bus_width", 0)
        if clock_khz and bus_bits:
            return 2 * clock_khz * 1e3 * bus_bits / 8, "spec: 2 x memory clock x bus width"
        return math.nan, "unknown (torch gives no memory clock here: pass --peak-gbs)"
    src = torch.empty(1 << 25)  # 128 MB: well past any cache
    dst = torch.empty_like(src)
    seconds = median_seconds(lambda: dst.copy_(src), 5)
    return 2 * src.numel() * 4 / seconds, "measured: one thread's copy"


def select_bytes(n: int, k: int) -> int:
    """Bytes a memory-bound selection must move: gradient read, residual read and written, chunk written."""
    return 12 * n + 6 * k


def decode_bytes(n: int, k: int, world: int) -> int:
    """Bytes a memory-bound decode must move: the bucket written, every rank's chunk read."""
    return 4 * n + 6 * k * world


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
    ap.add_argument("--paths", default="native,pytorch,sampled", help="which paths (native: the CPU only)")
    ap.add_argument("--peak-gbs", type=float, default=None, help="the device's peak memory bandwidth, GB/s")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device here")
    if args.device == "cpu" and native.library() is None:
        print("the native kernels are unavailable (see the message above): the PyTorch path only")
    where = torch.cuda.get_device_name() if args.device == "cuda" else "one CPU thread"
    peak, peak_source = ((args.peak_gbs * 1e9, "--peak-gbs") if args.peak_gbs else peak_bandwidth(args.device))
    print(f"peak memory bandwidth {peak / 1e9:.0f} GB/s ({peak_source})")
    paths = args.paths.split(",")
    rows = []
    for model in args.model.split(","):
        step, n = compute_step(model, args.batch, args.repeats, args.device)
        print(f"{model}: {n / 1e6:.1f}M parameters, compute step (fwd+bwd, batch {args.batch}) "
              f"{step * 1e3:.1f} ms, {where}")
        print(f"{'density':>8} {'path':>8} {'select ms':>10} {'decode ms':>10} {'total ms':>9} {'x step':>7} "
              f"{'sel GB/s':>9} {'dec GB/s':>9} {'% peak':>7}")
        gen = torch.Generator(device=args.device).manual_seed(0)
        grad = torch.randn(n, generator=gen, device=args.device)
        buf = torch.zeros(n, device=args.device)
        for density in (float(d) for d in args.densities.split(",")):
            k = math.ceil(density * n)
            for path, s, d in measure(k, grad, buf, gen, args.world, args.repeats, paths):
                sel_gbs, dec_gbs = select_bytes(n, k) / s / 1e9, decode_bytes(n, k, args.world) / d / 1e9
                both_gbs = (select_bytes(n, k) + decode_bytes(n, k, args.world)) / (s + d) / 1e9
                pct = 100 * both_gbs * 1e9 / peak
                print(f"{density:>8g} {path:>8} {s * 1e3:>10.3f} {d * 1e3:>10.3f} {(s + d) * 1e3:>9.3f} "
                      f"{(s + d) / step:>7.3f} {sel_gbs:>9.1f} {dec_gbs:>9.1f} {pct:>6.1f}%")
                rows.append({"model": model, "parameters": n, "device": where, "batch": args.batch,
                             "compute_step_ms": round(step * 1e3, 3), "density": density, "path": path,
                             "select_ms": round(s * 1e3, 4), "decode_ms": round(d * 1e3, 4),
                             "overhead_x_step": round((s + d) / step, 4),
                             "select_gbs": round(sel_gbs, 2), "decode_gbs": round(dec_gbs, 2),
                             "peak_gbs": round(peak / 1e9, 1), "peak_source": peak_source,
                             "pct_of_peak": round(pct, 2)})
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


def measure(k, grad, buf, gen, world, repeats, paths=("native", "pytorch", "sampled")):
    """(path, select seconds, decode seconds) for the native path (CPU, where built), the exact PyTorch path and
    the sampled one."""
    n, device = grad.numel(), grad.device.type
    out = []
    if "native" in paths and device == "cpu" and native.library() is not None:
        residual = torch.zeros(n)
        selector = native.Selector()
        chunks = [selector.select(residual, grad, k, True, True, gen)] * world
        sel_native = median_seconds(lambda: selector.select(residual, grad, k, True, True, gen), repeats)
        dec_native = median_seconds(lambda: native.decode(buf, chunks, k, True, world), repeats)
        out.append(("native", sel_native, dec_native))
    for name, path in (("pytorch", torch_path), ("sampled", sampled_path)):
        if name not in paths:
            continue
        ws, residual_t = Workspace(), torch.zeros(n, device=grad.device)
        sel = median_seconds(lambda path=path, ws=ws, residual_t=residual_t: path(residual_t, grad, k, gen, ws, world),
                             repeats, device)
        chunks = path(residual_t, grad, k, gen, ws, world)
        dec = median_seconds(lambda chunks=chunks: torch_decode(buf, chunks, k, world), repeats, device)
        out.append((name, sel, dec))
    return out


if __name__ == "__main__":
    main()
