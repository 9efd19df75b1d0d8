"""Error feedback: what a step did not send is added to the next step's gradient.

Invariant (tested): for every bucket, sum of gradients fed in == sum of what
was sent + the residual still held. Residuals are keyed by bucket index; DDP
rebuilds its buckets after the first iteration, so a residual whose size no
longer matches its bucket is dropped (the hooks keep iteration 0 dense, so in
practice nothing is dropped).
"""

from __future__ import annotations

import torch


class ResidualMemory:
    def __init__(self) -> None:
        self.residuals: dict[int, torch.Tensor] = {}

    def slot(self, index: int, grad: torch.Tensor) -> torch.Tensor:
        """The bucket's residual (zeros at first), for a caller that adds ``grad`` itself."""
        r = self.residuals.get(index)
        if r is None or r.numel() != grad.numel() or r.device != grad.device:
            r = torch.zeros_like(grad)
            self.residuals[index] = r
        return r

    def compensate(self, index: int, grad: torch.Tensor) -> torch.Tensor:
        """residual += grad; returns the residual, which now holds the full signal.

        The caller selects from it and subtracts what it sends (see :meth:`sent`).
        """
        return self.slot(index, grad).add_(grad)

    @staticmethod
    def sent(residual: torch.Tensor, indices: torch.Tensor, values: torch.Tensor) -> None:
        """Remove what was actually transmitted (after any fp16 rounding)."""
        residual.index_add_(0, indices, values.to(residual.dtype), alpha=-1)

    def flush_into(self, index: int, grad: torch.Tensor) -> None:
        """Before a dense step: fold the residual into the gradient, nothing is lost."""
        r = self.residuals.pop(index, None)
        if r is not None and r.numel() == grad.numel():
            grad.add_(r)
