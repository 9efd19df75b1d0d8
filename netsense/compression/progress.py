"""How much of a dense step's progress a compressed update makes, measured while training.

A step's update U (the averaged gradient the hook hands the optimizer) lowers
the loss, to first order, by lr * <grad L, U>. A dense step's would be
lr * <grad L, G>, G the mean of the ranks' gradients. Neither grad L nor G is
known to one rank, but the NEXT step's local gradient g_{t+1} is an unbiased
estimate of grad L taken on a fresh minibatch, whose noise is independent of
U_t; and the rank's own gradient g_t has the same expectation as G. So over
steps

    r = sum <g_{t+1}, U_t> / sum <g_{t+1}, g_t>

estimates the fraction of a dense step's progress the compressed updates
made. With error feedback a delayed entry still counts when it is sent, if the
gradient still points its way; what r misses is what delay costs: entries that
wait while the gradient turns. Each rank measures its two dot products per
bucket (no extra communication: the step's agreed measurements carry them)
from a copy of the previous raw gradient and of the previous update: two
copies and two dot products of the gradient a step.

With momentum correction (memory.LocalMomentum) the dense step's update is
the rank's velocity u_t, not g_t: the probe keeps u_t as the reference and
reads r = sum <g_{t+1}, U_t> / sum <g_{t+1}, u_t> (g_{t+1} still raw).

The controller (netsense.control.tta, TimeToAccuracyController) reads r
at its own density d as the steps model's 1 / (1 + knee / d).
"""

from __future__ import annotations

import torch


class ProgressProbe:
    """Per bucket: the last raw gradient and the last update, and the two dot products of each new
    gradient with them."""

    def __init__(self) -> None:
        self.grads: dict[int, torch.Tensor] = {}
        self.updates: dict[int, torch.Tensor] = {}
        self._fresh: set[int] = set()  # buckets whose kept update is the previous step's

    def gradient(self, index: int, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Read bucket ``index``'s raw gradient of this step against what the previous step left: returns
        (<g, U_prev>, <g, dense_prev>) when it left both, else None. Tensors: no sync. Then call
        :meth:`dense` with this step's dense update."""
        g_prev, u_prev = self.grads.get(index), self.updates.get(index)
        out = None
        if index in self._fresh and g_prev is not None and g_prev.numel() == grad.numel() == u_prev.numel():
            g = grad.float()
            out = torch.dot(g, u_prev.float()), torch.dot(g, g_prev.float())
        self._fresh.discard(index)
        return out

    def dense(self, index: int, update: torch.Tensor) -> None:
        """Keep the update a dense step would apply, the reference the next gradient is read against: the raw
        gradient, or with momentum correction the velocity (call before anything changes it in place)."""
        kept = self.grads.get(index)
        if kept is None or kept.numel() != update.numel():
            kept = self.grads[index] = torch.empty_like(update)
        kept.copy_(update)

    def update(self, index: int, update: torch.Tensor) -> torch.Tensor:
        """Record the update the bucket's collective produced; returns it (a future's ``then`` callback)."""
        kept = self.updates.get(index)
        if kept is None or kept.numel() != update.numel():
            kept = self.updates[index] = torch.empty_like(update)
        kept.copy_(update)
        self._fresh.add(index)
        return update
