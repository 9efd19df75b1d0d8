"""The paper's pruning on the two compressor paths: the fused native kernels (CPUs) and eager PyTorch (GPUs,
or no compiler). They implement it differently: native skips the pruned entries while scanning, PyTorch
zeroes their magnitude before TopK. A user may run either (ranks may even mix them), so what is selected and
sent, and what error feedback keeps, must not depend on the path.

Pruning (netsense's ``pruneFactor``): the entries of the smallest-|weight| fraction are left out of the
TopK; their gradient is not lost, error feedback keeps it like any entry not sent."""

from __future__ import annotations

import pytest
import torch
from support import unavailable

from netsense.compression import native
from netsense.compression.compressor import TopK
from netsense.compression.memory import ResidualMemory
from netsense.compression.selection import prune_threshold

SEED = 5


@pytest.fixture(scope="module", autouse=True)
def kernels() -> None:
    if native.library() is None:
        unavailable("the native kernels are unavailable here (no C++ compiler, or NETSENSE_NATIVE=0)")


class Bucket:
    """What TopK reads of a DDP GradBucket: one parameter, its gradient as the flat buffer."""

    def __init__(self, weights: torch.Tensor, grad: torch.Tensor) -> None:
        self.param = torch.nn.Parameter(weights.clone())
        self.buf = grad.clone()

    def index(self) -> int:
        return 0

    def buffer(self) -> torch.Tensor:
        return self.buf

    def gradients(self) -> list[torch.Tensor]:
        return [self.buf]

    def parameters(self) -> list[torch.Tensor]:
        return [self.param]


def _steps(path: str, weights: torch.Tensor, grads: list[torch.Tensor], k: int, fp16: bool, prune: float,
           monkeypatch: pytest.MonkeyPatch, prime: torch.Tensor | None = None) -> list[tuple]:
    """Sparse steps on ``path`` ("native" or "pytorch"), one per gradient, by one compressor (as a hook keeps
    it). Per step: the indices sent (sorted), their values as sent (in fp32), the residual afterwards, and the
    signal they were selected from (the residual before + the gradient). With ``prime``, an unpruned step by
    another compressor first leaves a residual behind (the same on both paths: TopK without pruning is
    exact)."""
    with monkeypatch.context() as m:
        if path == "pytorch":
            m.setattr(native, "usable", lambda t: False)
        bucket, memory = Bucket(weights, grads[0]), ResidualMemory()
        if prime is not None:
            bucket.buf.copy_(prime)
            TopK(SEED + 1, rank=0).compress(bucket, k, fp16, 0.0, memory)
        topk, out = TopK(SEED, rank=0), []
        for grad in grads:
            bucket.buf.copy_(grad)
            residual = sum(memory.residuals.values(), torch.zeros_like(grad))
            packed = topk.compress(bucket, k, fp16, prune, memory)
            idx = packed[:4 * k].view(torch.int32).long()
            values = packed[4 * k:].view(torch.float16 if fp16 else torch.float32).float()
            order = idx.argsort()
            out.append((idx[order], values[order], memory.residuals[0].clone(), residual + grad))
        return out


def _prune_generator() -> torch.Generator:
    """The pruning stream of a fresh compressor seeded as _steps seeds it."""
    return TopK(SEED, rank=0).generator(torch.device("cpu"), "prune")


def _case(n: int, seed: int, steps: int = 1) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Weights of uneven scale by layer (as a network's), a first gradient (to prime the residual) and the
    gradients of ``steps`` steps."""
    g = torch.Generator().manual_seed(seed)
    weights = torch.cat([torch.randn(n // 2, generator=g) * 0.01, torch.randn(n - n // 2, generator=g)])
    return weights, torch.randn(n, generator=g), [torch.randn(n, generator=g) for _ in range(steps)]


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
@pytest.mark.parametrize("n, k, prune", [(1_000, 10, 0.3), (200_000, 2_000, 0.5), (100_003, 30_000, 0.6),
                                         (200_000, 2_000, 0.95)])
def test_both_paths_prune_alike(monkeypatch, n: int, k: int, prune: float, fp16: bool):
    """Where at least k entries survive pruning (the paper's settings: pruneFactor x (1 - ratio) leaves more
    than the ratio), both paths send the same entries with the same values (bit for bit, fp16 rounding
    included) and keep the same residual: the k largest |residual + gradient| among the entries whose
    |weight| is at or above the pruning threshold; every pruned entry's gradient stays in the residual."""
    weights, prime, grads = _case(n, seed=n + k)
    threshold = prune_threshold(weights, prune, _prune_generator())  # the one the compressor draws from
    survives = weights.abs() >= threshold
    assert int(survives.sum()) >= k, "a case for the regime where enough entries survive"
    (idx, values, left, signal), = _steps("native", weights, grads, k, fp16, prune, monkeypatch, prime)
    (t_idx, t_values, t_left, t_signal), = _steps("pytorch", weights, grads, k, fp16, prune, monkeypatch, prime)
    assert signal.ne(grads[0]).any() and torch.equal(signal, t_signal), "both start from the same residual"
    assert torch.equal(idx, t_idx), f"the paths selected {int((idx != t_idx).sum())} different entries"
    torch.testing.assert_close(values, t_values, rtol=0, atol=0)
    torch.testing.assert_close(left, t_left, rtol=0, atol=0)
    # what both selected: the TopK of the survivors
    want = torch.topk(signal.abs().masked_fill(~survives, -1), k).indices.sort().values
    assert torch.equal(idx, want)
    torch.testing.assert_close(values, signal[idx].half().float() if fp16 else signal[idx], rtol=0, atol=0)
    # error feedback: the residual holds everything not sent, pruned entries included
    torch.testing.assert_close(left.index_add(0, idx, values), signal, rtol=0, atol=1e-6)
    assert torch.equal(left[~survives], signal[~survives])


@pytest.mark.parametrize("path", ["pytorch", "native"])
def test_where_fewer_than_k_survive_pruning_every_entry_is_ranked(monkeypatch, path: str):
    """Pruning leaves the smallest-|weight| entries out of the TopK while at least k entries survive it; where
    fewer survive (a high pruneFactor with fp16 values, whose density is twice the ratio), that step ranks
    every entry, pruned ones too, on both paths alike: the plain TopK, k entries sent, the residual keeping
    the rest."""
    n, k, prune = 1_000, 600, 0.5
    weights, _, grads = _case(n, seed=1)
    survives = weights.abs() >= prune_threshold(weights, prune, _prune_generator())
    assert int(survives.sum()) < k, "a case for the regime where too few entries survive"
    (idx, values, left, signal), = _steps(path, weights, grads, k, False, prune, monkeypatch)
    assert torch.equal(idx, signal.abs().topk(k).indices.sort().values), f"{path}: not the plain TopK"
    torch.testing.assert_close(left.index_add(0, idx, values), signal, rtol=0, atol=1e-6)


def test_both_paths_prune_alike_step_after_step(monkeypatch):
    """A run keeps one compressor per bucket: the paths' agreement must last beyond its first step."""
    n, k, prune = 200_000, 2_000, 0.5
    weights, _, grads = _case(n, seed=3, steps=3)
    native_steps = _steps("native", weights, grads, k, False, prune, monkeypatch)
    torch_steps = _steps("pytorch", weights, grads, k, False, prune, monkeypatch)
    for step, ((idx, *_), (t_idx, *_)) in enumerate(zip(native_steps, torch_steps, strict=True)):
        differ = len(set(idx.tolist()) ^ set(t_idx.tolist())) // 2
        assert differ == 0, f"step {step}: {differ} of {k} entries differ between the paths"
