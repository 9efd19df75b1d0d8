"""TopK by a sampled threshold, with fixed-size outputs and no host synchronization (``selection: sampled``).

The exact path (selection.py, native.py) reads counts back to the host (``nonzero``, ``int(...)``) to size its
tensors: on a GPU every such read waits for the queue to drain, and a bucket's selection becomes a train of
small launch-bound kernels (~1 ms for an 11M-element bucket on an H200 whatever the density; ~4.6 ms a step on a
563k-parameter MLP; testbed/results/gpu-check-h200.md). Here every tensor's size is known on the host before a
kernel runs, so the whole selection is queued at once (DGC's idea, Lin et al. 2018: a threshold from a sample):

1. ``s`` positions drawn uniformly, with replacement, from the bucket's n magnitudes (``sample_size``: about
   ``HITS / p`` for the density ``p = k / n``, within [SAMPLE_MIN, SAMPLE_MAX]);
2. the threshold ``t`` is the sample's ``j``-th largest magnitude, ``j = ceil(s p (1 + eps))``
   (``margin``: eps), floored at the smallest normal float so that zeros are never candidates;
3. the candidates, ``|g| >= t``, are compacted in index order into ``cap = ceil(k (1 + eps)^2)`` slots
   (``torch.nonzero_static``: one fixed-size output, unfilled slots marked -1);
4. ``torch.topk`` over the ``cap`` candidates' magnitudes (unfilled slots score -1) picks exactly k slots.
   Slots that hold no candidate (fewer than k above ``t``) become padding: value 0 at the index of the first
   candidate (a coordinate really sent, so momentum masking clears only a sent coordinate; index 0 if there
   is none), which adds nothing wherever it is summed (the decode's ``index_add_``, the residual's update).

The bound. Let ``C = #{i : |g_i| >= t}`` (the count before truncation or padding) and ``a_(c)`` the c-th
largest magnitude (values distinct). ``C < k`` iff ``t > a_(k)``, iff at least j sampled values lie among the
top k-1 entries: a Binomial(s, (k-1)/n) count X of mean below ``s p``; by Chernoff,
``P(X >= (1+eps) s p) <= exp(-eps^2 s p / (2 + eps))``. ``C > cap`` iff fewer than j sampled values lie among
the top ``cap`` entries: X ~ Binomial(s, cap/n), mean ``mu >= s p (1+eps)^2``, and ``j - 1 < s p (1+eps) <=
mu / (1+eps)``, so ``P <= exp(-(eps/(1+eps))^2 mu / 2) <= exp(-eps^2 s p / 2)``. Hence

    P(C < k  or  C > cap)  <=  2 exp(-eps^2 s p / (2 + eps)),

and ``margin`` solves ``eps^2 s p = (2 + eps) ln(1 / FAILURE)``: each tail at most FAILURE (1e-6) per bucket
and step. (With s p = 1024, eps = 0.171: C within [k, 1.37 k].) Inside that range every entry of the exact top k
is a candidate (``C >= k`` means ``t <= a_(k)``) and none is truncated (``C <= cap``), so step 4 returns exactly
the top k (recall 1, ties aside). A bucket no larger than the sample, or whose ``cap`` reaches n, is ranked
whole by ``torch.topk`` (exact, and no dearer than the sample). Outside it: below, the ``C`` largest are sent and the rest of the k slots are
padding (recall C/k); above, the first ``cap`` candidates by index are ranked (recall lower, the later layers'
large entries wait a step). Ties at ``t`` (quantized gradients) can make C jump past ``cap``, the same
truncation. Either way nothing is lost: error feedback keeps exactly what was not sent (residual = signal -
sent, bit for bit: the sent values are subtracted as ``index_add_`` with the very values packed; padding
subtracts 0). A NaN magnitude is never a candidate (it stays in the residual; the loss shows it).

Cost: one pass for |g| (in the workspace), one compare, nonzero_static's passes over the mask, and kernels of
size s or cap: memory-bound and sync-free. On CPUs the exact path's fused kernels stay the default.
"""

from __future__ import annotations

import math

import torch

SAMPLE_MIN = 65_536  # sampled magnitudes at least (a dense density's quantile needs few hits, but a bucket-sized
SAMPLE_MAX = 1 << 21  # sample costs little next to the pass over the bucket); at most (~2M: 8 MB gathered)
HITS = 1024  # sampled magnitudes expected above the threshold: s = HITS / p within [SAMPLE_MIN, SAMPLE_MAX]
FAILURE = 1e-6  # each tail's probability bound, per bucket and step (margin)


def sample_size(n: int, k: int) -> int:
    """Sampled positions for k of n: about ``HITS / p`` (``p = k / n``), within [SAMPLE_MIN, SAMPLE_MAX]."""
    return int(min(SAMPLE_MAX, max(SAMPLE_MIN, math.ceil(HITS * n / max(1, k)))))


def margin(s: int, p: float, failure: float | None = None) -> float:
    """eps with ``exp(-eps^2 s p / (2 + eps)) = failure`` (default FAILURE): the positive root of
    ``m eps^2 - L eps - 2L`` (``m = s p``, ``L = ln(1 / failure)``)."""
    m, log = s * p, math.log(1 / (FAILURE if failure is None else failure))
    return (log + math.sqrt(log * log + 8 * log * m)) / (2 * m)


def plan(n: int, k: int) -> tuple[int, int, int]:
    """(s, j, cap): the sample size, the threshold's rank in the sample (j-th largest), the candidate slots."""
    s = sample_size(n, k)
    p = k / n
    eps = margin(s, p)
    j = min(s, math.ceil(s * p * (1 + eps)))
    cap = min(n, math.ceil(k * (1 + eps) ** 2))
    return s, j, cap


def count_bound(n: int, k: int) -> float:
    """The probability bound on ``C < k or C > cap`` for k of n (the module doc): 2 exp(-eps^2 s p/(2+eps))."""
    s = sample_size(n, k)
    p = k / n
    eps = margin(s, p)
    return 2 * math.exp(-eps * eps * s * p / (2 + eps))


def threshold(magnitude: torch.Tensor, k: int, generator: torch.Generator | None) -> torch.Tensor:
    """A 0-d tensor (on the magnitudes' device, never read by the host): the sampled threshold for k of them."""
    n = magnitude.numel()
    s, j, _ = plan(n, k)
    positions = torch.randint(0, n, (s,), generator=generator, device=magnitude.device)
    t = torch.topk(magnitude[positions], j, sorted=False).values.amin()
    return t.clamp(min=torch.finfo(magnitude.dtype).tiny)  # zeros are never worth a slot


def select(magnitude: torch.Tensor, k: int, generator: torch.Generator | None,
           mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(indices, real): exactly k int64 indices of large magnitudes (the top k with probability at least
    ``1 - count_bound``) and a bool tensor marking the real ones; padding slots (not real) hold a valid index.

    ``mask`` (n bools), if given, is used as the candidates' scratch buffer. Nothing here synchronizes with
    the host: every size is known from n and k."""
    n = magnitude.numel()
    if k >= n:
        return torch.arange(n, device=magnitude.device), torch.ones(n, dtype=torch.bool, device=magnitude.device)
    samples, _, cap = plan(n, k)
    if cap >= n or samples >= n:  # nearly dense, or a bucket no larger than the sample: rank it all (exact)
        picked = torch.topk(magnitude, k, sorted=False).indices
        return picked, torch.ones(k, dtype=torch.bool, device=magnitude.device)
    t = threshold(magnitude, k, generator)
    above = torch.ge(magnitude, t, out=mask) if mask is not None else magnitude >= t
    candidates = torch.nonzero_static(above, size=cap, fill_value=-1).view(-1)  # index order, -1 = unfilled
    filled = candidates >= 0
    scores = torch.where(filled, magnitude[candidates.clamp(min=0)], -1.0)
    slots = torch.topk(scores, k, sorted=False).indices
    indices = candidates[slots]
    real = indices >= 0
    anchor = candidates[0].clamp(min=0)  # the first candidate (a sent coordinate), or 0 when there is none
    return torch.where(real, indices, anchor), real


def compress(signal: torch.Tensor, k: int, fp16: bool, generator: torch.Generator | None,
             magnitude: torch.Tensor | None = None, mask: torch.Tensor | None = None,
             error_feedback: bool = True) -> torch.Tensor:
    """The packed chunk (k int32 indices, then k values, fp16 or the signal's dtype) of ``select`` over
    ``|signal|``; with error feedback, what is sent is subtracted from ``signal`` (the residual) in place.

    Padding slots carry the value 0: decoded (summed by index) and subtracted, they add nothing.
    ``magnitude`` and ``mask``: optional scratch buffers of n elements (float, bool)."""
    magnitude = torch.abs(signal, out=magnitude) if magnitude is not None else signal.abs()
    indices, real = select(magnitude, k, generator, mask)
    values = torch.where(real, signal[indices], 0).to(torch.float16 if fp16 else signal.dtype)
    if error_feedback:
        # What was sent, after any fp16 rounding: signal[i] - float(fp16(signal[i])) is exact in fp32.
        signal.index_add_(0, indices, values.to(signal.dtype), alpha=-1)
    # Indices first: 4k bytes keep the values' offset aligned for any dtype view (compressor.py's format).
    return torch.cat([indices.to(torch.int32).view(torch.uint8), values.view(torch.uint8)])
