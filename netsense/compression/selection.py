"""Fast, exact TopK selection by magnitude on CPUs and GPUs.

``torch.topk`` over a ResNet18 bucket (millions of values) costs more than the
whole compute step on one CPU thread. We instead estimate the k-th largest
magnitude from a random sample, keep every element above a slightly lower
threshold (a superset of the true TopK, ~1.25k elements), and run the exact
``topk`` only on those candidates. If the sample was unlucky and fewer than k
elements pass, we fall back to the full ``topk``: the result is always the
exact TopK set (ties aside), only faster.
"""

from __future__ import annotations

import torch

SAMPLE = 32_768  # elements sampled for the threshold estimate
SLACK = 1.25  # keep ~1.25k candidates so the true TopK is inside with high probability
SMALL = 65_536  # below this, torch.topk is cheap enough


def topk_indices(magnitude: torch.Tensor, k: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Indices of the k largest entries of a flat non-negative tensor (unsorted)."""
    n = magnitude.numel()
    if k >= n:
        return torch.arange(n, device=magnitude.device)
    if n <= SMALL or k * 4 > n:
        return torch.topk(magnitude, k, sorted=False).indices
    sample_idx = torch.randint(0, n, (SAMPLE,), device=magnitude.device, generator=generator)
    sample = magnitude[sample_idx]
    # The (1 - SLACK*k/n) quantile of the sample: about SLACK*k elements lie above it.
    rank = max(1, min(SAMPLE, int(SAMPLE * (1 - SLACK * k / n))))
    threshold = sample.kthvalue(rank).values
    candidates = (magnitude >= threshold).nonzero().view(-1)
    if candidates.numel() < k:
        return torch.topk(magnitude, k, sorted=False).indices
    top = torch.topk(magnitude[candidates], k, sorted=False).indices
    return candidates[top]


def smallest_fraction_mask(values: torch.Tensor, fraction: float,
                           generator: torch.Generator | None = None) -> torch.Tensor:
    """Boolean mask of (about) the ``fraction`` smallest-|value| entries (sampled quantile)."""
    n = values.numel()
    if fraction <= 0 or n == 0:
        return torch.zeros(n, dtype=torch.bool, device=values.device)
    mag = values.abs()
    sample = mag[torch.randint(0, n, (min(n, SAMPLE),), device=values.device, generator=generator)]
    threshold = torch.quantile(sample.float(), min(1.0, fraction))
    return mag < threshold
