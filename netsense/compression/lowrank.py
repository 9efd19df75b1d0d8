"""Low-rank compression: PowerSGD (Vogels, Karimireddy and Jaggi, NeurIPS 2019), one power iteration per step
with warm start, in this package's hook (GRACE's split: this module is the compressor's math and state; the
residual is memory.ResidualMemory's, the collectives communicator's).

Per parameter of a bucket, its gradient (with error feedback: plus the residual) as an n x m matrix M:

    P = M Q                 (n x r; Q: m x r, this parameter's from the last step: the warm start)
    P <- sum over ranks     (one all_reduce, waited for: the next line needs it)
    P^ = orthonormal(P)     (reduced QR)
    Q = M^T P^              (m x r)
    Q <- sum over ranks     (a second all_reduce, asynchronous: the backward pass goes on)
    applied = P^ Q^T / N    (N ranks: the mean of the ranks' M, projected onto P^'s columns)
    residual = M - applied  (each rank: what it fed and the model did not get; over the ranks,
                             N x applied + sum of residuals = sum of M: nothing is lost)

Vectors (biases) and matrices too small to gain (rank x (n + m) x 2 >= n x m, torch's min_compression_rate)
travel whole in the first all_reduce, and hold no residual. Q is kept per parameter (not per bucket), so DDP's
bucket rebuild after step 0 moves nothing, and compression may begin at step 0; torch's own hook keys its state
by bucket index and needs two dense steps first (start_powerSGD_iter >= 2 with error feedback).

On the wire each rank sends 2(N-1)/N x (r(n + m) + the vectors' elements) x 4 bytes a step, against
2(N-1)/N x n m x 4 dense.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

MIN_COMPRESSION_RATE = 2.0


def to_wire(values: torch.Tensor, world: int, fp16: bool) -> torch.Tensor:
    """What a low-rank all_reduce sends: the fp32 values, or their share of the mean as fp16 (a sum of N fp16
    values could overflow where their mean cannot)."""
    return values.div(world).to(torch.float16) if fp16 else values


def from_wire(wire: torch.Tensor, values: torch.Tensor, world: int, fp16: bool) -> torch.Tensor:
    """The summed values in fp32 (``values``, the tensor sent, holds them in place when it went as is)."""
    return values.copy_(wire).mul_(world) if fp16 else wire


@dataclass
class Piece:
    """One parameter's place in its bucket: ``offset`` and ``numel`` in the flat buffer; ``shape`` (n, m) when it
    is compressed as a matrix, None when it travels whole."""

    param: torch.Tensor
    offset: int
    numel: int
    shape: tuple[int, int] | None


def matrix_shape(shape: tuple[int, ...], rank: int) -> tuple[int, int] | None:
    """A parameter of this shape as the n x m matrix PowerSGD compresses at ``rank``; None where it travels whole
    (a vector, or a matrix too small to gain)."""
    if len(shape) < 2:
        return None
    n = shape[0]
    m = math.prod(shape) // n
    r = min(rank, n, m)
    return (n, m) if r * (n + m) * MIN_COMPRESSION_RATE < n * m else None


def layout(shapes: list[tuple[int, ...]], rank: int) -> tuple[list[tuple[int, int]], int]:
    """The matrices compressed at ``rank`` and the elements sent whole, for a model's parameter shapes: what its
    wire costs (netsense.control.cost.lowrank_allreduce_bytes)."""
    matrices, whole = [], 0
    for shape in shapes:
        mat = matrix_shape(shape, rank)
        if mat is None:
            whole += math.prod(shape)
        else:
            matrices.append(mat)
    return matrices, whole


def thin_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for a thin b (a few columns), computed as (b^T a^T)^T: the same product, but the large matrix is
    read along its rows. On one CPU thread M Q and M^T P of a 512 x 3072 matrix at rank 4 took 1.9 and 5.0 ms
    this way round against 0.4 ms each (a 10x gap: most of a PowerSGD step's own work on set 2's MLP)."""
    return (b.t() @ a.t()).t()


class LowRank:
    """The compressor's state: each parameter's Q (the warm start), drawn at first use from a generator seeded
    alike on every rank (the buckets are met in the same order everywhere)."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.qs: dict[int, torch.Tensor] = {}  # id(parameter) -> Q, m x r
        self._generator: torch.Generator | None = None

    @staticmethod
    def pieces(buf: torch.Tensor, views: list[torch.Tensor], params: list[torch.Tensor], rank: int) -> list[Piece]:
        base = buf.storage_offset()
        out = []
        for view, param in zip(views, params, strict=True):
            shape = matrix_shape(tuple(param.shape), rank)
            out.append(Piece(param, view.storage_offset() - base, view.numel(), shape))
        return out

    def q(self, piece: Piece, rank: int, device: torch.device) -> torch.Tensor:
        n, m = piece.shape
        r = min(rank, n, m)
        q = self.qs.get(id(piece.param))
        if q is None or q.shape != (m, r) or q.device != device:
            if self._generator is None:
                self._generator = torch.Generator().manual_seed(self.seed)
            q = torch.randn(m, r, generator=self._generator).to(device)
            self.qs[id(piece.param)] = q
        return q

    def first_pass(self, signal: torch.Tensor, pieces: list[Piece], rank: int
                   ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The first all_reduce's tensor: each matrix's P = M Q, then the vectors whole; and the matrices M."""
        mats, parts = [], []
        for p in pieces:
            flat = signal[p.offset:p.offset + p.numel]
            if p.shape is None:
                continue
            m = flat.view(p.shape)
            mats.append(m)
            parts.append(thin_product(m, self.q(p, rank, signal.device)).reshape(-1))
        parts += [signal[p.offset:p.offset + p.numel] for p in pieces if p.shape is None]
        return torch.cat(parts) if parts else signal.new_zeros(0), mats

    def second_pass(self, reduced: torch.Tensor, mats: list[torch.Tensor], pieces: list[Piece], rank: int
                    ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """From the summed P's: the orthonormal P^ of each matrix, the second all_reduce's tensor (each
        Q = M^T P^), and the summed vectors."""
        hats, qs, at = [], [], 0
        for p, m in zip((p for p in pieces if p.shape is not None), mats, strict=True):
            n, cols = p.shape
            r = min(rank, n, cols)
            hat = torch.linalg.qr(reduced[at:at + n * r].view(n, r), mode="reduced").Q
            at += n * r
            hats.append(hat)
            qs.append(thin_product(m.t(), hat).reshape(-1))
        return torch.cat(qs) if qs else reduced.new_zeros(0), hats, reduced[at:]

    def apply(self, buf: torch.Tensor, signal: torch.Tensor | None, pieces: list[Piece], hats: list[torch.Tensor],
              q_sum: torch.Tensor, vectors: torch.Tensor, world: int, rank: int) -> None:
        """buf <- the mean the model applies; signal (the residual, with error feedback) <- what it did not."""
        at_q = at_v = 0
        matrices = (p for p in pieces if p.shape is not None)
        for p, hat in zip(matrices, hats, strict=True):
            n, m = p.shape
            r = min(rank, n, m)
            q = q_sum[at_q:at_q + m * r].view(m, r)
            at_q += m * r
            applied = (hat @ q.t()).div_(world).reshape(-1)
            if signal is not None:
                signal[p.offset:p.offset + p.numel].sub_(applied)
            buf[p.offset:p.offset + p.numel].copy_(applied)
            self.qs[id(p.param)] = q.clone()  # the warm start of the next step
        for p in pieces:
            if p.shape is None:
                buf[p.offset:p.offset + p.numel].copy_(vectors[at_v:at_v + p.numel]).div_(world)
                if signal is not None:
                    signal[p.offset:p.offset + p.numel].zero_()  # sent whole: nothing held back
                at_v += p.numel
