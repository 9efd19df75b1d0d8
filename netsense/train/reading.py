"""An in-run reading of what each candidate compressor would keep of this task's gradient (issue 62, item 3): a
study instrument, recorded for the first ``steps`` steps of a run (spec.training.readingSteps). Judged at the
decision level as registered (testbed/studies/reading/), it failed its bar (2 of 8 tasks within 1.1x of the
hindsight-best, the bar 7): nothing decides on it.

Per step, of each rank's own gradient as computed (before error feedback, momentum correction or the
collective), summed over the step's buckets:

    energy          ||g||^2
    topk:d          the squared norm of the ceil(d n) largest-magnitude elements of each bucket (n: its size),
                    as the hook's TopK selects per bucket
    powersgd:r      the squared norm PowerSGD at rank r keeps: per parameter compressed as an n x m matrix M
                    (lowrank.matrix_shape), one power iteration warm-started from the last step's Q
                    (P = M Q, P^ = orthonormal(P), Q = M^T P^, kept ||P^ Q^T||^2 = ||Q||^2); the parameters that
                    travel whole (vectors, small matrices) kept in full

and each candidate's captured fraction ``kept / energy`` (1 for dense). The candidates' error-feedback residuals
are not simulated: with error feedback nothing is lost, it is delayed, and the captured fraction of the fresh
gradient is the contraction constant (delta, with ||C(x) - x||^2 <= (1 - delta) ||x||^2) that error-feedback
SGD's rates are stated in (Stich and Karimireddy 2019). The power iteration runs on the rank's own gradient,
where the hook's runs on the sum over ranks: the same warm start, a different matrix.

The reading's work is timed on the real clock (``seconds`` a step): the simulated clock prices a step's compute as
measured without it, so a study adds it to the run that reads.
"""

from __future__ import annotations

import math
import time

import torch

from netsense.compression.lowrank import matrix_shape

DENSITIES = (0.001, 0.005, 0.02)
RANKS = (1, 4)


def candidates() -> list[str]:
    return [f"topk:{d}" for d in DENSITIES] + [f"powersgd:{r}" for r in RANKS]


class Reading:
    """Per step, each candidate's captured fraction of this rank's gradient, for the first ``steps`` steps."""

    def __init__(self, steps: int, seed: int = 0):
        self.steps = steps
        self.rows: list[dict] = []
        # (parameter, rank) -> its warm start: keyed by the parameter, not by its place in a bucket, since DDP
        # rebuilds its buckets after the first step (a bucket's index then holds other parameters)
        self._q: dict[tuple[int, int], torch.Tensor] = {}
        self._generator = torch.Generator().manual_seed(seed)
        self._step: dict[str, float] | None = None
        self._seconds = 0.0

    @property
    def active(self) -> bool:
        return len(self.rows) < self.steps

    def observe(self, index: int, buf: torch.Tensor, views: list[torch.Tensor], params: list[torch.Tensor]) -> None:
        """One bucket's gradient (its flat buffer, the parameters' views into it, the parameters), before the hook
        changes it."""
        if not self.active:
            return
        t0 = time.perf_counter()
        if index == 0 or self._step is None:
            self._step = {"energy": 0.0, **{c: 0.0 for c in candidates()}}
        kept = self._step
        flat = buf.detach().float()
        energy = float(flat.square().sum())
        kept["energy"] += energy
        n = flat.numel()
        ks = [max(1, math.ceil(d * n)) for d in DENSITIES]
        top = torch.topk(flat.abs(), min(max(ks), n), sorted=True).values.square().cumsum(0)
        for d, k in zip(DENSITIES, ks, strict=True):
            kept[f"topk:{d}"] += float(top[min(k, n) - 1])
        for view, param in zip(views, params, strict=True):
            g = view.detach().float()
            for r in RANKS:
                shape = matrix_shape(tuple(g.shape), r)
                if shape is None:
                    kept[f"powersgd:{r}"] += float(g.square().sum())
                    continue
                kept[f"powersgd:{r}"] += self._power_kept(g.reshape(shape), (id(param), r), min(r, *shape))
        self._seconds += time.perf_counter() - t0

    def _power_kept(self, m: torch.Tensor, key: tuple[int, int], rank: int) -> float:
        q = self._q.get(key)
        if q is None:
            q = torch.randn(m.shape[1], rank, generator=self._generator)
        p, _ = torch.linalg.qr(m @ q)
        q = m.t() @ p
        self._q[key] = q
        return float(q.square().sum())

    def end_step(self, step: int, loss: float) -> None:
        """Close the step's row (``step``: its number from 1; ``loss``: this rank's training loss)."""
        if self._step is None or not self.active:
            return
        energy = self._step["energy"]
        row = {"step": step, "loss": round(loss, 6), "grad_sq": energy, "seconds": round(self._seconds, 6)}
        row.update({c: round(self._step[c] / energy, 6) if energy > 0 else 1.0 for c in candidates()})
        self.rows.append(row)
        self._step, self._seconds = None, 0.0

    def record(self) -> dict:
        """What result.json keeps: the candidates, each step's row, and the reading's mean seconds a step."""
        seconds = [r["seconds"] for r in self.rows]
        return {"candidates": candidates(), "steps": self.rows,
                "seconds_per_step": round(sum(seconds) / len(seconds), 6) if seconds else None}
