"""Error feedback: what a step did not send is added to the next step's gradient.

Invariant (tested): for every parameter, sum of gradients fed in == sum of what was sent + the residual still
held, across DDP's bucket rebuild too. Residuals (and momentum correction's velocities) are flat per bucket,
laid out as the bucket's buffer, but each piece belongs to its parameter: DDP rebuilds its buckets after the
first step (another order, other sizes), and each parameter's piece then moves to its place in the new layout
(``ParameterLayout``). So compression may begin at step 0.
"""

from __future__ import annotations

import torch


class ParameterLayout:
    """Flat per-bucket tensors whose pieces follow their parameters through DDP's bucket rebuild.

    ``tensor(index, grad, views, params)`` is bucket ``index``'s tensor, shaped as its buffer ``grad`` (whose
    per-parameter views are ``views``). When the bucket at ``index`` holds other parameters than last time (the
    rebuild after step 0), a new tensor is made and each parameter's piece is copied from wherever it was; the
    old layout's buckets that shared a parameter are dropped (their other pieces are kept per parameter until
    their new bucket claims them).
    """

    def __init__(self) -> None:
        self.tensors: dict[int, torch.Tensor] = {}
        self.layouts: dict[int, tuple[int, ...]] = {}
        self.by_param: dict[int, torch.Tensor] = {}  # id(parameter) -> its piece of a bucket's tensor

    def tensor(self, index: int, grad: torch.Tensor, views: list[torch.Tensor],
               params: list[torch.Tensor], create: bool = True) -> torch.Tensor | None:
        """The bucket's tensor; None (with ``create`` False) where no parameter of it has a piece yet."""
        layout = tuple(id(p) for p in params)
        t = self.tensors.get(index)
        if t is not None and self.layouts[index] == layout and t.numel() == grad.numel() and t.device == grad.device:
            return t
        if not create and not any(id(p) in self.by_param for p in params):
            return None
        t = torch.zeros_like(grad)
        members = set(layout)
        for stale in [i for i, ids in self.layouts.items() if i != index and members.intersection(ids)]:
            del self.tensors[stale], self.layouts[stale]
        base = grad.storage_offset()
        for view, param in zip(views, params, strict=True):
            start = view.storage_offset() - base
            piece = t[start:start + view.numel()]
            old = self.by_param.get(id(param))
            if old is not None and old.numel() == piece.numel():
                piece.copy_(old.to(piece.device))
            self.by_param[id(param)] = piece
        self.tensors[index], self.layouts[index] = t, layout
        return t

    def get(self, index: int) -> torch.Tensor | None:
        """The tensor last laid out for ``index`` (no layout check: for what the same step made)."""
        return self.tensors.get(index)


class ResidualMemory:
    """What sparse steps did not send, per parameter (laid out per bucket: ``ParameterLayout``)."""

    def __init__(self) -> None:
        self.layout = ParameterLayout()

    @property
    def residuals(self) -> dict[int, torch.Tensor]:
        """The residuals by bucket index (the current layout's)."""
        return self.layout.tensors

    def slot(self, index: int, grad: torch.Tensor, views: list[torch.Tensor],
             params: list[torch.Tensor]) -> torch.Tensor:
        """The bucket's residual (zeros at first), for a caller that adds ``grad`` itself."""
        return self.layout.tensor(index, grad, views, params)

    def compensate(self, index: int, grad: torch.Tensor, views: list[torch.Tensor],
                   params: list[torch.Tensor]) -> torch.Tensor:
        """residual += grad; returns the residual, which now holds the full signal.

        The caller selects from it and subtracts what it sends (see :meth:`sent`).
        """
        return self.slot(index, grad, views, params).add_(grad)

    @staticmethod
    def sent(residual: torch.Tensor, indices: torch.Tensor, values: torch.Tensor) -> None:
        """Remove what was actually transmitted (after any fp16 rounding)."""
        residual.index_add_(0, indices, values.to(residual.dtype), alpha=-1)

    def flush_into(self, index: int, grad: torch.Tensor, views: list[torch.Tensor],
                   params: list[torch.Tensor]) -> None:
        """Before a dense step: fold the residual into the gradient (and empty it), nothing is lost."""
        r = self.layout.tensor(index, grad, views, params, create=False)
        if r is not None:
            grad.add_(r)
            r.zero_()

    def total(self) -> float:
        """The sum of every residual held (for tests and diagnostics)."""
        return float(sum(float(p.sum()) for p in self.layout.by_param.values()))


class LocalMomentum:
    """Momentum correction (DGC, Lin et al., ICLR 2018), optionally with momentum factor masking.

    With error feedback and the optimizer's momentum, a coordinate TopK skips waits in the residual,
    then leaves as one large value that the optimizer's momentum goes on pushing for ~1/(1-m) more
    steps: updates later than they need be. So the hook owns the momentum (and the weight decay,
    which SGD puts through it) and the optimizer takes plain steps:

        u <- m u + g + wd w            (per rank, before compression)
        dense step:   send u           (exactly momentum SGD: the ranks' mean u is the global momentum)
        sparse step:  residual += u; send TopK(residual)

    What is sent over a run is then exactly what momentum SGD would apply, only later for the
    coordinates TopK skips (with error feedback; without it, what TopK skips stays in u and decays by m a
    step: TopK of the velocity). With ``masking`` (DGC's momentum factor masking) a sent coordinate's
    momentum is also forgotten, u[sent] <- 0: a coordinate sent every step then moves by g, not
    g/(1-m), so masking changes the optimizer (less momentum where the gradient is largest), not only
    the communication; measured on 2 dev seeds it cut the digits32 MLP's steps to 0.93 at 1% from 127
    (plain error feedback) to 41 (dense: 52), and raised the digits CNN's from 92 to 107. A dense step
    keeps the momentum even with masking (every coordinate is sent; clearing u there would make the
    dense steps of a controller plain SGD).

    Velocities are flat per bucket, like the gradient; when DDP rebuilds its buckets after step 0 each
    parameter's velocity moves to its place in the new layout, so step 0's momentum is kept too.
    """

    def __init__(self, momentum: float, weight_decay: float, masking: bool = False) -> None:
        self.momentum, self.weight_decay, self.masking = momentum, weight_decay, masking
        self.layout = ParameterLayout()

    @property
    def velocities(self) -> dict[int, torch.Tensor]:
        """The velocities by bucket index (the current layout's)."""
        return self.layout.tensors

    def accumulate(self, index: int, grad: torch.Tensor, views: list[torch.Tensor],
                   params: list[torch.Tensor]) -> None:
        """grad <- m u + grad + wd w, in place, and u <- grad (``views``: grad's slice per parameter, as DDP
        lays them out)."""
        if self.weight_decay:
            for view, param in zip(views, params, strict=True):
                view.add_(param.detach(), alpha=self.weight_decay)
        u = self.layout.tensor(index, grad, views, params)
        grad.add_(u, alpha=self.momentum)
        u.copy_(grad)

    def sent(self, index: int, indices: torch.Tensor) -> None:
        """A sparse step sent these coordinates: with masking, forget their momentum."""
        u = self.layout.get(index)
        if self.masking and u is not None:
            u.index_fill_(0, indices.to(torch.long), 0)


class SharedMomentum(LocalMomentum):
    """Momentum after the all-reduce, as the optimizer applies it (identical on every rank): tta's PowerSGD
    steps while its TopK and dense steps run with momentum correction (``lowRankMomentumCorrection`` false).

        U <- m U + (mean update) + wd w;   the model applies U

    PowerSGD as published keeps its momentum in the optimizer; on the development MLP on digits32 it needed
    fewer steps so (rank 4: 56 steps to the target on average without momentum correction, 73 with it, paired
    ratio 1.20 [0.94, 1.54]: suggestive, not significant; testbed/results/dev-pilot-set2-momentum.md), while
    TopK with error feedback needs the correction. A switch of family converts the momentum
    without losing or adding any of what momentum SGD would still apply. With momentum m, a gradient's whole
    contribution is g / (1 - m): under momentum correction (local velocity u, residual e of velocities) what a
    rank still holds is worth ``e + u m / (1 - m)``; after the all-reduce (residual e of gradients, shared U)
    ``e / (1 - m) + U m / (1 - m)``. So, per bucket:

        to PowerSGD:  e <- (1 - m) e + m u;   u <- 0;   U <- 0
        to TopK:      e <- e / (1 - m);       u <- U;   U <- 0   (every rank's u is the shared U: their mean)

    (tested: tests/test_feedback.py, the momentum cases). The residual carries the difference, so this needs
    error feedback.
    """

    def apply(self, index: int, update: torch.Tensor, views: list[torch.Tensor],
              params: list[torch.Tensor]) -> torch.Tensor:
        """update <- U <- m U + update + wd w, in place (LocalMomentum's recurrence, on the averaged update);
        returns it (a future's ``then`` callback)."""
        self.accumulate(index, update, views, params)
        return update

    def to_shared(self, index: int, residual: torch.Tensor, local: LocalMomentum, grad: torch.Tensor,
                  views: list[torch.Tensor], params: list[torch.Tensor]) -> None:
        """Bucket ``index`` leaves momentum correction for the shared momentum (see the class doc)."""
        m = self.momentum
        u = local.layout.tensor(index, grad, views, params)
        residual.mul_(1 - m).add_(u, alpha=m)
        u.zero_()
        self.layout.tensor(index, grad, views, params).zero_()

    def to_local(self, index: int, residual: torch.Tensor, local: LocalMomentum, grad: torch.Tensor,
                 views: list[torch.Tensor], params: list[torch.Tensor]) -> None:
        """Bucket ``index`` returns from the shared momentum to momentum correction (see the class doc)."""
        shared = self.layout.tensor(index, grad, views, params)
        residual.div_(1 - self.momentum)
        local.layout.tensor(index, grad, views, params).copy_(shared)
        shared.zero_()
