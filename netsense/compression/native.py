"""The fused CPU kernels of native.cpp: build once, load with ctypes, select with them.

Why: on one CPU thread the sparse path is memory-bound, and eager PyTorch reads
and writes the whole bucket five times per step (see native.cpp). The kernels
do error feedback, thresholding and candidate extraction in one pass, then rank
only the candidates, so selection costs about one pass over the gradient.

Build: ``c++ -O3 -march=native`` (g++ >= 12 or clang >= 15, for ``_Float16``) into
``$NETSENSE_NATIVE_DIR`` (default ``~/.cache/netsense/native``), named by a hash
of the source, the flags and the compiler, written atomically so concurrent
workers can race safely. Nothing needs torch headers: about a second.
``NETSENSE_NATIVE=0`` turns it off; without a compiler the hooks use the
PyTorch path (selection.py) and say so once. GPUs always use the PyTorch path.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import torch

from netsense.compression.selection import SAMPLE, Workspace, sampling_margin
from netsense.errors import NetsenseError

SOURCE = Path(__file__).with_name("native.cpp")
# -march=native: F16C converts halves in hardware (GCC emulates _Float16 in software
# without it, 10x slower) and AVX2 widens the scan. The library is built on the
# machine that runs it (the key includes the CPU's flags), so native is safe.
FLAGS = ["-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-fno-math-errno"]


class NativeUnavailable(NetsenseError, RuntimeError):
    pass


def _compiler() -> str:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return name
    raise NativeUnavailable("no C++ compiler found (set CXX, or install g++)")


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


def build(directory: Path | None = None) -> Path:
    """Compile native.cpp unless a library for this source and compiler exists; its path."""
    directory = Path(directory or os.environ.get("NETSENSE_NATIVE_DIR") or Path.home() / ".cache/netsense/native")
    cxx = _compiler()
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode() + version.encode()
                         + _cpu_flags().encode()).hexdigest()[:16]
    target = directory / f"netsense-native-{key}.so"
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, suffix=".so.tmp")
    os.close(fd)
    try:
        proc = subprocess.run([cxx, *FLAGS, str(SOURCE), "-o", tmp], capture_output=True, text=True)
        if proc.returncode != 0:
            raise NativeUnavailable(f"{cxx} failed: {proc.stderr.strip()[-500:]}")
        os.replace(tmp, target)  # atomic: a racing worker sees the old name or the whole file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


@lru_cache(maxsize=1)
def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None (disabled, or unavailable: reported once on stderr)."""
    if os.environ.get("NETSENSE_NATIVE", "1") == "0":
        return None
    try:
        lib = ctypes.CDLL(str(build()))
    except (NativeUnavailable, OSError) as e:
        print(f"netsense: native CPU kernels unavailable ({e}); using the slower PyTorch path",
              file=sys.stderr)
        return None
    i64, f32, ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
    lib.ns_sample.argtypes = [ptr, ptr, i64, ptr, f32, ptr, i64, ctypes.c_uint64]
    lib.ns_sample.restype = None
    lib.ns_ranks.argtypes = [ptr, i64, i64, i64, ptr]
    lib.ns_ranks.restype = None
    lib.ns_scan.argtypes = [ptr, ptr, i64, f32, ptr, f32, ptr, ptr, i64]
    lib.ns_scan.restype = i64
    lib.ns_take.argtypes = [ptr, ptr, ptr, i64, i64, f32, ptr, ptr, ctypes.c_int, ctypes.c_int]
    lib.ns_take.restype = None
    lib.ns_decode.argtypes = [ptr, i64, ptr, ctypes.c_int, i64, i64, ctypes.c_int, f32]
    lib.ns_decode.restype = None
    return lib


def usable(t: torch.Tensor) -> bool:
    return (t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous()
            and t.numel() < 2**31 and library() is not None)


class Selector:
    """Fused error feedback + exact TopK + packing for one bucket.

    Thresholds come from a stratified sample of this step's magnitudes (one
    random position per window, as selection.jittered_positions), with the
    margin of selection.sampling_margin either side of k. If fewer than k
    elements reach ``lo`` the pass is repeated read-only with a lower one: the
    result is exact either way, only the unlucky step is slower.
    """

    def __init__(self) -> None:
        self.cand = torch.empty(0, dtype=torch.int32)  # candidate indices
        self.cand_val = torch.empty(0, dtype=torch.float32)  # and their values
        self.workspace = Workspace()  # the packed output, reused: fresh 45 MB would page-fault
        self.retries = 0  # passes repeated so far

    @staticmethod
    def _thresholds(sample: torch.Tensor, above_lo: float, above_hi: float) -> tuple[float, float]:
        """Values with about ``above_lo`` (``above_hi``) of the sample at or above them."""
        m = sample.numel()

        def rank(fraction: float) -> int:  # 0-based rank in ascending order
            return min(m - 1, max(0, round(m * (1 - fraction)) - 1))

        out = (ctypes.c_float * 2)()
        library().ns_ranks(sample.data_ptr(), m, rank(above_lo), rank(above_hi), out)
        return (0.0 if above_lo >= 1 else out[0]), (math.inf if above_hi <= 0 else out[1])

    def select(self, signal: torch.Tensor, grad: torch.Tensor | None, k: int, fp16: bool,
               error_feedback: bool, generator: torch.Generator, weights: torch.Tensor | None = None,
               prune_below: float = 0.0) -> torch.Tensor:
        """Packed int32 indices then values (fp16 or fp32) of the k largest |signal + grad|.

        The result is a view of a buffer the next call reuses: send it before then.

        With grad, signal += grad first (in place). With error_feedback, what is
        sent is subtracted from signal. Indices come out ascending. Pruned
        entries (|weights| < prune_below) are not ranked while at least k
        others remain; where fewer remain, every entry is ranked.
        """
        lib = library()
        n = signal.numel()
        g_ptr = grad.data_ptr() if grad is not None else None
        w_ptr = weights.data_ptr() if weights is not None else None
        stride = max(1, n // SAMPLE)
        seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        sample = self.workspace.get("sample", (n + stride - 1) // stride, torch.float32, signal.device)
        lib.ns_sample(signal.data_ptr(), g_ptr, n, w_ptr, prune_below, sample.data_ptr(), stride, seed)
        p = k / n
        eps = sampling_margin(sample.numel(), p)
        lo, hi = self._thresholds(sample, p * (1 + eps), p * (1 - eps))
        cap = int(k * (1 + 2 * eps)) + 4096
        self._reserve(cap)
        count = self._scan(signal, g_ptr, lo, w_ptr, prune_below, cap)
        while count < k or count > cap:  # the sample was unlucky: scan again (read-only now)
            self.retries += 1
            if count > cap:
                cap = count
                self._reserve(cap)
            elif lo > 0.0:
                eps = eps * 2 + 0.5
                lo, _ = self._thresholds(sample, p * (1 + eps), p * (1 - eps))
            elif w_ptr is not None:  # pruning left fewer than k elements: rank all of them, pruned ones too
                w_ptr = None
            else:  # even |x| >= 0 fails: NaN
                raise FloatingPointError(f"gradient bucket has {n - count} NaN values; training diverged")
            count = self._scan(signal, None, lo, w_ptr, prune_below, cap)
        value_bytes = 2 if fp16 else 4
        packed = self.workspace.get("packed", k * (4 + value_bytes), torch.uint8, signal.device)
        lib.ns_take(signal.data_ptr(), self.cand.data_ptr(), self.cand_val.data_ptr(), count, k, hi,
                    packed.data_ptr(), packed.data_ptr() + 4 * k, int(fp16), int(error_feedback))
        return packed

    def _reserve(self, cap: int) -> None:
        if self.cand.numel() < cap:
            self.cand = torch.empty(cap, dtype=torch.int32)
            self.cand_val = torch.empty(cap, dtype=torch.float32)

    def _scan(self, signal: torch.Tensor, g_ptr: int | None, threshold: float, w_ptr: int | None,
              prune_below: float, cap: int) -> int:
        return library().ns_scan(signal.data_ptr(), g_ptr, signal.numel(), threshold, w_ptr, prune_below,
                                 self.cand.data_ptr(), self.cand_val.data_ptr(), cap)


def decode(buf: torch.Tensor, chunks: list[torch.Tensor], k: int, fp16: bool, divisor: float,
           capacity: int | None = None) -> None:
    """buf = sum over chunks of scatter(indices, values / divisor), as index_add_ would, over the first k of
    each chunk's ``capacity`` (default k) entries."""
    ptrs = (ctypes.c_void_p * len(chunks))(*(c.data_ptr() for c in chunks))
    library().ns_decode(buf.data_ptr(), buf.numel(), ptrs, len(chunks), k, capacity or k, int(fp16), divisor)


if __name__ == "__main__":  # `python -m netsense.compression.native`: build ahead of the first job
    print(build())
