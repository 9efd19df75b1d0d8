"""One DDP comm hook for every method, and the state it keeps.

``CompressionState`` + ``compress_hook`` follow torch's ddp_comm_hooks style:
the hook is registered once with ``model.register_comm_hook(state, compress_hook)``
(or ``netsense.compression.register``) and returns a future holding the bucket's
averaged gradient. It never blocks: collectives are launched async and the
decompression runs in ``then`` callbacks, so communication overlaps the rest of
the backward pass.

Per step (detected by bucket index 0, which DDP always launches first):

1. the previous step's measurements (wire bytes, busy seconds, compute
   seconds, gradient norm, ...) were finalized by ``end_step`` (the trainer
   calls it after the optimizer step, else it runs here), which also launched a
   tiny async all_reduce averaging them over ranks; it has finished during the
   forward pass;
2. the averaged measurements are fed to the policy -- every rank feeds it
   identical numbers and gets an identical decision (density, k, fp16, dense or
   sparse), one step after the measured step;
3. the policy decides this step.

With momentum correction (memory.LocalMomentum) each rank's gradient first
becomes its velocity ``u = m u + g + wd w`` and the optimizer applies neither.
Dense path: ``g/N`` all_reduced (fp32 or fp16), with any residual folded in
first. Sparse path: error feedback (memory.py), exact TopK with optional pruning
(compressor.py), one all_gather of each rank's packed chunk, every chunk summed
into the bucket (communicator.py runs and times the collectives).

Compression begins at step 0: DDP rebuilds its buckets after it, and each
parameter's residual (and velocity) moves with it to its new place
(memory.ParameterLayout), so nothing requires a dense first step. Dense steps are
those a policy chose, the warm-up a user asked for (``warmupSteps``), or the
method's own (allreduce; fp16); each record says which (``dense_reason``).
"""

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from netsense.compression import communicator
from netsense.compression.compressor import TopK
from netsense.compression.lowrank import LowRank, from_wire, to_wire
from netsense.compression.memory import LocalMomentum, ResidualMemory, SharedMomentum
from netsense.compression.steps import MeasuredState
from netsense.control.cost import (
    dense_allreduce_bytes,
    lowrank_allreduce_bytes,
    sparse_allgather_bytes,
)
from netsense.control.decision import Decision, Policy, StepMeasurement

MEASURED = tuple(StepMeasurement.__dataclass_fields__)  # what the ranks agree on, in this order


class CompressionState(MeasuredState):
    """The state of ``compress_hook``.

    policy     chooses each step's Decision from agreed measurements (None: plain dense allreduce)
    decision   this step's (density, fp16, dense or sparse, prune)
    warmup     this step is dense because compression has not begun (warmupSteps, default none)
    memory     error feedback: what sparse steps did not send, by bucket (None without it)
    topk       the sparse compressor: selection (``selection``: exact or sampled) and packing, and summing the
               gathered chunks
    lowrank    the low-rank compressor (PowerSGD): each parameter's warm start
    momentum   the SGD momentum and weight decay, applied here instead of by the optimizer (memory.py:
               momentum correction; None: the optimizer applies them)
    shared     with momentum correction, the momentum of PowerSGD steps applied after the all-reduce instead
               (memory.SharedMomentum; None: every step runs with the correction)
    null_wire  the collectives move no bytes (communicator.py: the benchmark's contention-matched ceiling)
    """

    def __init__(self, policy: Policy | None, process_group: dist.ProcessGroup | None = None,
                 error_feedback: bool = True, warmup_steps: int = 0, need_grad_stats: bool = False, seed: int = 0,
                 momentum: LocalMomentum | None = None,
                 shared: SharedMomentum | None = None, null_wire: bool = False, selection: str = "exact"):
        super().__init__(process_group)
        self.null_wire = null_wire
        self.policy = policy
        self.memory = ResidualMemory() if error_feedback else None
        self.momentum = momentum
        if shared is not None and (momentum is None or self.memory is None):
            raise ValueError("lowRankMomentumCorrection false (a shared momentum for PowerSGD steps) takes over "
                             "from momentum correction through the residual: it needs both, and errorFeedback")
        self.shared = shared
        self.shared_step = False  # this step's momentum is the shared one (a PowerSGD step)
        self.switching = False  # ... and the last step's was not, or the other way round
        self.topk = TopK(seed, dist.get_rank(process_group), selection)
        self.lowrank = LowRank(seed)
        self.warmup_steps = warmup_steps
        self.need_grad_stats = need_grad_stats
        self.decision = Decision()
        self.warmup = False
        self.warmed: list[tuple[int, int, bool]] = []  # (n, k, fp16) run once at registration (warm.py; CUDA)
        self._agreement: torch.futures.Future | None = None

    def optimizer_terms(self, momentum: float, weight_decay: float) -> tuple[float, float]:
        """The (momentum, weight decay) the SGD optimizer should apply: none of either when this hook does."""
        return (0.0, 0.0) if self.momentum is not None else (momentum, weight_decay)

    def finish(self) -> None:
        """End the last step and wait for its measurement agreement: a collective still in flight when the
        process group goes away aborts the process."""
        super().finish()
        self._agreed()

    def _decision_fields(self) -> dict:
        d = self.decision
        reason = "" if not d.dense else "warm-up" if self.warmup else "method" if self.policy is None else "controller"
        return {"fp16": d.fp16, "dense": d.dense, "lowrank_rank": 0 if d.dense else d.rank, "warmup": self.warmup,
                "dense_reason": reason,
                "probe": bool(getattr(self.policy, "probing", False)) and not self.warmup}

    def _extra_fields(self, record: dict) -> dict:
        return {"elements_sent": 0.0 if self.decision.dense else record["elements_sent"],  # the selection's work
                **(self.policy.estimates() if self.policy else {})}

    def _ended(self, record: dict) -> None:
        if self.policy is not None and self.policy.measures:  # agree on this step's numbers while the next forward runs
            mine = torch.tensor([record[f] for f in MEASURED], dtype=torch.float64, device=self.device)
            self._agreement = dist.all_reduce(mine, group=self.group, async_op=True).get_future()
            self.carry("all_reduce", 2 * (self.world - 1) / self.world * mine.numel() * mine.element_size())

    def _agreed(self) -> StepMeasurement | None:
        if self._agreement is None:
            return None
        total = self._agreement.wait()[0].tolist()
        self._agreement = None
        return StepMeasurement(*(v / self.world for v in total)) if total[0] > 0 else None

    def _beginning(self) -> None:
        measured = self._agreed()
        if self.policy is not None and measured is not None:
            # self.warmup is still the measured step's: a step the policy did not decide is only sensed
            (self.policy.sense if self.warmup else self.policy.update)(measured)
        self.warmup = self.policy is not None and self.step + 1 < self.warmup_steps
        self.decision = self.policy.decide() if self.policy is not None and not self.warmup else Decision()
        if self.shared is not None:
            shared = bool(self.decision.rank) and not self.decision.dense
            self.switching, self.shared_step = shared != self.shared_step, shared

    def switch_momentum(self, bucket: dist.GradBucket) -> None:
        """Move this bucket's momentum to the family of this step (memory.SharedMomentum's conversions)."""
        index, buf, views, params = bucket.index(), bucket.buffer(), bucket.gradients(), bucket.parameters()
        residual = self.memory.slot(index, buf, views, params)
        convert = self.shared.to_shared if self.shared_step else self.shared.to_local
        convert(index, residual, self.momentum, buf, views, params)

    # -- the two paths --------------------------------------------------------------
    def dense(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        buf, fp16 = bucket.buffer(), self.decision.fp16
        if self.memory is not None:  # residual from sparse steps is not lost
            self.memory.flush_into(bucket.index(), buf, bucket.gradients(), bucket.parameters())
        buf.div_(self.world)
        tensor = buf.to(torch.float16) if fp16 else buf
        n, c = buf.numel(), self.counts
        wire = dense_allreduce_bytes(n, self.world, fp16)
        c.wire_bytes += wire
        c.payload_bytes += n * tensor.element_size()
        c.elements_sent += n
        c.elements_total += n

        def done(f: torch.futures.Future) -> torch.Tensor:
            if fp16:
                buf.copy_(f.value()[0])
            return buf

        return communicator.allreduce(tensor, self.group, self.timer, done, self.null_wire, wire)

    def sparse(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        t0 = self.selection_timer.start()
        d, buf = self.decision, bucket.buffer()
        n = buf.numel()
        k = max(1, min(n, math.ceil(d.density * n)))
        packed = self.topk.compress(bucket, k, d.fp16, d.prune, self.memory)
        if self.momentum is not None:
            self.momentum.sent(bucket.index(), packed[:4 * k].view(torch.int32))
        selected, pad = k, math.ceil(d.pad * n)
        if pad:  # a padded probe: zeros after the selection (index 0, value 0: they add nothing)
            packed = padded(packed, k, pad)
            k += pad
        ws = self.topk.workspace(bucket)
        gathered = [ws.get(f"gathered{r}", packed.numel(), torch.uint8, buf.device) for r in range(self.world)]
        c = self.counts
        self.selection_timer.stop(t0)
        wire = sparse_allgather_bytes(k, self.world, d.fp16)
        c.wire_bytes += wire
        c.payload_bytes += packed.numel()
        c.elements_sent += selected  # the selection's work: padding costs none
        c.elements_total += n
        c.sparse_elements += n
        def done(_: torch.futures.Future) -> torch.Tensor:
            t1 = self.selection_timer.start()  # decoding is the compressor's own work (SelectionCost), not compute
            # Only the selection is decoded: a padded probe's zeros are wire, never gradient (decoded, a 2.3 MB
            # probe at 0.1% on syn4 took 24 ms of selection against an unpadded step's 7).
            TopK.decompress(buf, gathered, selected, d.fp16, self.world, k)
            self.selection_timer.stop(t1)
            return buf

        return communicator.allgather(gathered, packed, self.group, self.timer, done, self.null_wire, wire)


    def low_rank(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """PowerSGD at the decision's rank (lowrank.py): the P's (and the vectors) all_reduced and waited for,
        then the Q's all_reduced asynchronously; error feedback in the same residual as TopK's. With fp16 the
        factors travel as 16-bit values: divided by the workers before the cast (a sum of N fp16 values could
        overflow where their mean cannot), cast back and multiplied after, orthogonalized and applied in fp32;
        the residual is taken against what was applied, so the rounding is kept, not lost."""
        t0 = self.selection_timer.start()
        rank, buf, fp16 = self.decision.rank, bucket.buffer(), self.decision.fp16
        views, params = bucket.gradients(), bucket.parameters()
        signal = (self.memory.compensate(bucket.index(), buf, views, params) if self.memory is not None else buf)
        pieces = LowRank.pieces(buf, views, params, rank)
        first, mats = self.lowrank.first_pass(signal, pieces, rank)
        c = self.counts
        self.selection_timer.stop(t0)
        # Waited for here (the Q's need the summed P's): exposed time, not compute.
        wire_first = to_wire(first, self.world, fp16)
        self.timer.wait_for(lambda: communicator.allreduce_now(wire_first, self.group, self.null_wire), "all_reduce",
                            dense_allreduce_bytes(first.numel(), self.world, fp16))
        t1 = self.selection_timer.start()
        first = from_wire(wire_first, first, self.world, fp16)
        second, hats, vectors = self.lowrank.second_pass(first, mats, pieces, rank)
        self.selection_timer.stop(t1)
        shapes = [p.shape for p in pieces if p.shape is not None]
        c.wire_bytes += lowrank_allreduce_bytes(shapes, vectors.numel(), rank, self.world, fp16)
        c.payload_bytes += (first.numel() + second.numel()) * (2 if fp16 else first.element_size())
        c.elements_sent += first.numel() + second.numel()
        c.elements_total += buf.numel()
        c.lowrank_elements += buf.numel()
        residual = signal if self.memory is not None else None
        pad = math.ceil(self.decision.pad * buf.numel())
        if pad:  # a padded probe (tta): zeros after the Q's, on the wire and summed to zeros, never read
            second = torch.cat([second, second.new_zeros(pad)])
            c.wire_bytes += dense_allreduce_bytes(pad, self.world, fp16)
            c.payload_bytes += pad * (2 if fp16 else second.element_size())
        wire_second = to_wire(second, self.world, fp16)

        def done(_: torch.futures.Future) -> torch.Tensor:
            t2 = self.selection_timer.start()  # decoding: its own work, as the passes are (not compute)
            q_sum = from_wire(wire_second, second, self.world, fp16)
            self.lowrank.apply(buf, residual, pieces, hats, q_sum, vectors, self.world, rank)
            self.selection_timer.stop(t2)
            return buf

        return communicator.allreduce(wire_second, self.group, self.timer, done, self.null_wire,
                                      dense_allreduce_bytes(second.numel(), self.world, fp16))

def padded(packed: torch.Tensor, k: int, pad: int) -> torch.Tensor:
    """A packed (k indices, k values) chunk with ``pad`` zero entries after each part: (k + pad) of each."""
    value_bytes = (packed.numel() - 4 * k) // k
    zeros = packed.new_zeros(4 * pad), packed.new_zeros(value_bytes * pad)
    return torch.cat([packed[:4 * k], zeros[0], packed[4 * k:], zeros[1]])


def compress_hook(state: CompressionState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The DDP comm hook: dense or sparse per the state's decision for this step."""
    buf = bucket.buffer()
    if bucket.index() == 0:
        state.begin_step(buf.device)
    c = state.counts
    if state.need_grad_stats:  # of the gradient as computed, before error feedback: a property of the task
        # A tensor (no device sync here), in fp32 whatever the bucket's dtype (an fp16 square overflows),
        # and without a full-size temporary.
        c.grad_sq = c.grad_sq + torch.linalg.vector_norm(buf, 2, dtype=torch.float32).square()
    if state.switching:
        state.switch_momentum(bucket)
    if state.momentum is not None and not state.shared_step:  # buf becomes the velocity: a dense step's update
        state.momentum.accumulate(bucket.index(), buf, bucket.gradients(), bucket.parameters())
    d = state.decision
    fut = state.dense(bucket) if d.dense else state.low_rank(bucket) if d.rank else state.sparse(bucket)
    index = bucket.index()
    if state.shared_step:
        views, params = bucket.gradients(), bucket.parameters()
        fut = fut.then(lambda f: state.shared.apply(index, f.value(), views, params))
    return fut


class TorchHookState(MeasuredState):
    """torch's own hooks (fp16) with our measurements around them.

    inner_hook, inner_state   the torch hook and its state
    wire                      bytes a bucket puts on the wire under that hook
    fp16                      the hook sends 16-bit values (for the record)
    always_dense              every value is sent (fp16); else a step is dense when every bucket's wire is the
                              dense fp32 all-reduce's
    """

    def __init__(self, inner_hook: Callable, inner_state: Any, wire: Callable[[dist.GradBucket], float],
                 process_group: dist.ProcessGroup | None = None, fp16: bool = False, always_dense: bool = False):
        super().__init__(process_group)
        self.inner_hook, self.inner_state, self.wire = inner_hook, inner_state, wire
        self.fp16, self.always_dense = fp16, always_dense
        self.dense = True  # this step's buckets were all sent dense

    def _beginning(self) -> None:
        self.dense = True

    def _decision_fields(self) -> dict:
        return {"fp16": self.fp16, "dense": self.dense, "warmup": False,
                "dense_reason": "method" if self.dense else "", "probe": False}

    def _extra_fields(self, record: dict) -> dict:
        return {"elements_sent": 0.0}  # the measure of selection work: these hooks select nothing


def torch_hook(state: TorchHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    if bucket.index() == 0:
        state.begin_step(bucket.buffer().device)
    n, c = bucket.buffer().numel(), state.counts
    wire = state.wire(bucket)
    state.dense = state.dense and (state.always_dense or wire >= dense_allreduce_bytes(n, state.world))
    c.wire_bytes += wire
    c.payload_bytes += wire
    c.elements_total += n
    # Density as the fraction of dense wire bytes actually sent.
    c.elements_sent += n * min(1.0, wire / max(1.0, dense_allreduce_bytes(n, state.world))) if state.world > 1 else n
    return communicator.launch(lambda: state.inner_hook(state.inner_state, bucket), state.timer,
                               lambda f: f.value(), "all_reduce", wire)
