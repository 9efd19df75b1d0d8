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

Dense path: ``g/N`` all_reduced (fp32 or fp16). Sparse path: error feedback
(residual + g), optional pruning of smallest-|weight| entries, exact TopK of the
magnitude, then one all_gather of each rank's packed (values, int32 indices);
every rank's contribution is *accumulated* as ``index_add_`` would (colliding
indices sum, signs kept) and the sum divided by the world size:

    g_avg = (1/N) * sum_r scatter_add(indices_r, values_r)

On CPUs the sparse path runs in fused kernels (native.cpp); on GPUs, or where no
compiler is found, in eager PyTorch. Both select the same entries and decode alike.

Iteration 0 is always dense: DDP rebuilds buckets after it, and bucket indices
are only stable afterwards (the residual memory is keyed by them).
"""


import math
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from netsense.compression import native
from netsense.compression.memory import ResidualMemory
from netsense.compression.selection import (
    Workspace,
    prune_threshold,
    smallest_fraction_mask,
    topk_indices,
)
from netsense.compression.timing import IntervalTimer
from netsense.control.policies import (
    Decision,
    Policy,
    StepMeasurement,
    dense_allreduce_bytes,
    sparse_allgather_bytes,
)

_MEASURE_FIELDS = len(StepMeasurement.__dataclass_fields__)


class CompressionState:
    def __init__(self, policy: Policy | None, process_group: dist.ProcessGroup | None = None,
                 error_feedback: bool = True, warmup_steps: int = 0, fp16: bool = False,
                 need_grad_norm: bool = False, seed: int = 0):
        self.policy = policy  # None: plain dense allreduce (fp32 or fp16)
        self.group = process_group
        self.world = dist.get_world_size(process_group)
        self.error_feedback = error_feedback
        self.warmup_steps = max(1, warmup_steps)  # iteration 0 is always dense
        self.fixed_fp16 = fp16
        self.need_grad_norm = need_grad_norm
        self.memory = ResidualMemory()
        self.workspaces: dict[int, Workspace] = {}
        self.selectors: dict[int, native.Selector] = {}
        self.generator_seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}
        self.step = -1
        self.decision = Decision(fp16=fp16)
        self.timer: IntervalTimer | None = None
        self._agreement: torch.futures.Future | None = None
        self._device = torch.device("cpu")
        self._step_start = 0.0
        self._forward_start: float | None = None  # set by start_step()
        self.warmup = False  # this step is dense because compression has not begun
        self._reset_counters()
        self.history: list[dict] = []  # one telemetry record per finished step
        self._finished = True

    # -- per-step bookkeeping -----------------------------------------------------
    def _reset_counters(self) -> None:
        self.wire_bytes = 0.0
        self.payload_bytes = 0.0
        self.selection_seconds = 0.0
        self.grad_sq = 0.0
        self.elements_sent = 0.0
        self.elements_total = 0.0

    def _generator(self, device: torch.device) -> torch.Generator:
        if device not in self._generators:
            g = torch.Generator(device=device)
            g.manual_seed(self.generator_seed + 7919 * dist.get_rank(self.group))
            self._generators[device] = g
        return self._generators[device]

    def end_step(self) -> dict | None:
        """Finalize the current step's telemetry (call after backward; idempotent).

        Returns the record, or None if no step is open. Called automatically when
        the next step begins, so loops that never call it still work.
        """
        if self._finished or self.timer is None:
            return None
        self._finished = True
        now = time.perf_counter()
        busy = self.timer.busy()
        # Compute = the step minus waiting for the network minus our own selection work.
        compute = max(1e-6, (now - self._step_start) - self.timer.exposed() - self.selection_seconds)
        record = {
            "step": self.step,
            "density": self.elements_sent / self.elements_total if self.elements_total else 1.0,
            "fp16": self.decision.fp16,
            "dense": self.decision.dense,
            "warmup": self.warmup,
            "wire_bytes": self.wire_bytes,
            "payload_bytes": self.payload_bytes,
            "comm_seconds": busy,
            "compute_seconds": compute,
            "selection_seconds": self.selection_seconds,
            "elements_sent": self.elements_sent if not self.decision.dense else 0.0,
            "grad_norm": math.sqrt(float(self.grad_sq)),
            **(self.policy.telemetry() if self.policy else {}),
        }
        self.history.append(record)
        if self.policy is not None:  # agree on this step's numbers while the next forward runs
            mine = torch.tensor([record["wire_bytes"], record["payload_bytes"], record["comm_seconds"],
                                 record["compute_seconds"], record["grad_norm"], record["selection_seconds"],
                                 record["elements_sent"]], dtype=torch.float64, device=self._device)
            assert mine.numel() == _MEASURE_FIELDS
            self._agreement = dist.all_reduce(mine, group=self.group, async_op=True).get_future()
        return record

    def start_step(self) -> None:
        """Mark the start of a step's forward pass (call before it).

        The compute a step costs starts there; without this mark it is timed from
        the first bucket's hook, which misses the forward pass and part of the
        backward."""
        self.end_step()
        self._forward_start = time.perf_counter()

    def finish(self) -> None:
        """End the last step and wait for its measurement agreement.

        Call before destroying the process group: a collective still in flight
        when the group goes away aborts the process.
        """
        self.end_step()
        if self._agreement is not None:
            self._agreement.wait()
            self._agreement = None

    def _begin_step(self, device: torch.device) -> None:
        self.end_step()
        if self._agreement is not None:
            agreed = self._agreement.wait()[0].tolist()
            self._agreement = None
            if self.policy is not None and agreed[0] > 0:
                self.policy.update(StepMeasurement(*(v / self.world for v in agreed)))
        self.step += 1
        self.warmup = self.policy is not None and self.step < self.warmup_steps
        if self.policy is None:
            self.decision = Decision(fp16=self.fixed_fp16)
        elif self.warmup:
            self.decision = Decision()
        else:
            self.decision = self.policy.decide()
        self._device = device
        self._reset_counters()
        self.timer = IntervalTimer(device)
        self._step_start = self._forward_start if self._forward_start is not None else time.perf_counter()
        self._forward_start = None
        self._finished = False

    # -- the two communication paths ----------------------------------------------
    def dense(self, bucket: dist.GradBucket, fp16: bool) -> torch.futures.Future[torch.Tensor]:
        buf = bucket.buffer()
        if self.error_feedback:
            self.memory.flush_into(bucket.index(), buf)  # residual from sparse steps is not lost
        buf.div_(self.world)
        tensor = buf.to(torch.float16) if fp16 else buf
        n = buf.numel()
        self.wire_bytes += dense_allreduce_bytes(n, self.world, fp16)
        self.payload_bytes += n * tensor.element_size()
        self.elements_sent += n
        self.elements_total += n
        timer, token = self.timer, self.timer.start()
        fut = dist.all_reduce(tensor, group=self.group, async_op=True).get_future()

        def finish(f: torch.futures.Future) -> torch.Tensor:
            timer.stop(token)
            if fp16:
                buf.copy_(f.value()[0])
            return buf

        return fut.then(finish)

    def sparse(self, bucket: dist.GradBucket, d: Decision) -> torch.futures.Future[torch.Tensor]:
        t0 = time.perf_counter()
        buf = bucket.buffer()
        n = buf.numel()
        k = max(1, min(n, math.ceil(d.density * n)))
        # Buffers reused across steps (DDP finishes a bucket before its next step begins).
        ws = self.workspaces.setdefault(bucket.index(), Workspace())
        fast = native.usable(buf)
        packed = self._select_native(bucket, d, k, ws) if fast else self._select_torch(bucket, d, k, ws)
        gathered = [ws.get(f"gathered{r}", packed.numel(), torch.uint8, buf.device) for r in range(self.world)]
        self.selection_seconds += time.perf_counter() - t0
        self.wire_bytes += sparse_allgather_bytes(k, self.world, d.fp16)
        self.payload_bytes += packed.numel()
        self.elements_sent += k
        self.elements_total += n
        timer, token = self.timer, self.timer.start()
        fut = dist.all_gather(gathered, packed, group=self.group, async_op=True).get_future()
        value_dtype = torch.float16 if d.fp16 else buf.dtype

        def finish(_: torch.futures.Future) -> torch.Tensor:
            timer.stop(token)
            if fast:
                native.decode(buf, gathered, k, d.fp16, self.world)
                return buf
            buf.zero_()
            for chunk in gathered:
                i = chunk[:4 * k].view(torch.int32).to(torch.long)
                v = chunk[4 * k:].view(value_dtype).to(buf.dtype).div_(self.world)
                buf.index_add_(0, i, v)  # accumulate: colliding indices from ranks sum
            return buf

        return fut.then(finish)

    def _select_native(self, bucket: dist.GradBucket, d: Decision, k: int, ws: Workspace) -> torch.Tensor:
        """Fused kernels (native.cpp): error feedback, exact TopK and packing in ~1 pass."""
        buf = bucket.buffer()
        gen = self._generator(buf.device)
        weights, prune_below = None, 0.0
        if d.prune > 0:
            weights = _flat_weights(bucket, ws)
            if weights is not None:
                prune_below = prune_threshold(weights, d.prune, gen)
        signal = self.memory.slot(bucket.index(), buf) if self.error_feedback else buf
        selector = self.selectors.setdefault(bucket.index(), native.Selector())
        return selector.select(signal, buf if self.error_feedback else None, k, d.fp16, self.error_feedback,
                               gen, weights, prune_below)

    def _select_torch(self, bucket: dist.GradBucket, d: Decision, k: int, ws: Workspace) -> torch.Tensor:
        """The same selection in eager PyTorch (GPUs, or CPUs without a compiler)."""
        buf = bucket.buffer()
        n = buf.numel()
        gen = self._generator(buf.device)
        signal = self.memory.compensate(bucket.index(), buf) if self.error_feedback else buf
        magnitude = torch.abs(signal, out=ws.get("magnitude", n, buf.dtype, buf.device))
        if d.prune > 0:
            weights = _flat_weights(bucket, ws)
            if weights is not None:
                magnitude.masked_fill_(smallest_fraction_mask(weights, d.prune, gen, ws), 0)
        indices = topk_indices(magnitude, k, gen, ws)
        values = signal[indices].to(torch.float16 if d.fp16 else buf.dtype)
        if self.error_feedback:
            ResidualMemory.sent(signal, indices, values)
        # Indices first: 4k bytes keep the values' offset aligned for any dtype view.
        return torch.cat([indices.to(torch.int32).view(torch.uint8), values.view(torch.uint8)])

    def telemetry(self) -> list[dict]:
        return self.history


def _flat_weights(bucket: dist.GradBucket, ws: Workspace) -> torch.Tensor | None:
    """The bucket's weights in the buffer's layout (None if the layouts differ)."""
    params = bucket.parameters()
    buf = bucket.buffer()
    if not params or sum(p.numel() for p in params) != buf.numel():
        return None
    out = ws.get("weights", buf.numel(), buf.dtype, buf.device)
    return torch.cat([p.detach().reshape(-1) for p in params], out=out)


def compress_hook(state: CompressionState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The DDP comm hook: dense or sparse per the state's decision for this step."""
    buf = bucket.buffer()
    if bucket.index() == 0:
        state._begin_step(buf.device)
    if state.need_grad_norm:
        state.grad_sq = state.grad_sq + buf.pow(2).sum()  # a tensor: no device sync here
    d = state.decision
    return state.dense(bucket, d.fp16) if d.dense else state.sparse(bucket, d)


class TorchHookState(CompressionState):
    """torch's own hooks (fp16, PowerSGD) with our telemetry around them."""

    def __init__(self, inner_hook: Callable, inner_state: Any, wire: Callable[[dist.GradBucket], float],
                 process_group: dist.ProcessGroup | None = None):
        super().__init__(policy=None, process_group=process_group, error_feedback=False)
        self.inner_hook, self.inner_state, self.wire = inner_hook, inner_state, wire


def torch_hook(state: TorchHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    if bucket.index() == 0:
        state._begin_step(bucket.buffer().device)
    n = bucket.buffer().numel()
    wire = state.wire(bucket)
    state.wire_bytes += wire
    state.payload_bytes += wire
    state.elements_total += n
    # Density as the fraction of dense wire bytes actually sent.
    state.elements_sent += n * min(1.0, wire / max(1.0, dense_allreduce_bytes(n, state.world))) if state.world > 1 else n
    timer, token = state.timer, state.timer.start()
    fut = state.inner_hook(state.inner_state, bucket)

    def finish(f: torch.futures.Future) -> torch.Tensor:
        timer.stop(token)
        return f.value()

    return fut.then(finish)

