"""Gradient compression for PyTorch DDP, selected by name.

    from netsense.compression import register
    state = register(ddp_model, {"method": "topk", "density": 0.01})
    ...                      # train as usual
    state.end_step()         # optional: this step's record (density, wire bytes, ...); all: state.history
    state.finish()           # after the last step, before destroy_process_group()

With ``momentumCorrection`` (topk, dc2, tta) pass the SGD momentum and weight decay to
``register``, which applies them inside the hook; build the optimizer with
``state.optimizer_terms(momentum, weight_decay)`` (zeros when the hook owns them).

Methods: allreduce (plain DDP), fp16 and powersgd (torch's own hooks), topk
(fixed density), netsense (paper-faithful NetSenseML), tta (ours: the density
that minimizes the predicted time to accuracy; "overlap" and "ours" are its old
names). Configuration uses the NetSenseJob's ``spec.compression`` names and is
validated by the same schema, so a bad value, or a setting of another method,
fails at once naming the field.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from netsense.compression import native
from netsense.compression.hooks import CompressionState, TorchHookState, compress_hook, torch_hook
from netsense.compression.memory import LocalMomentum
from netsense.compression.steps import MeasuredState
from netsense.control.policies import (
    DelayDriven,
    FixedDensity,
    PaperAIMD,
    TimeToAccuracyController,
    dense_allreduce_bytes,
)
from netsense.spec.job import COMPRESSION
from netsense.spec.schema import Errors

__all__ = ["CompressionState", "MeasuredState", "ddp_options", "register", "validate_config"]


def validate_config(config: dict | str | None) -> dict:
    """Normalize a compression config (defaults filled); raises SpecError naming bad fields."""
    from netsense.spec.job import SpecError

    if config is None or isinstance(config, str):
        config = {"method": config or "allreduce"}
    errors = Errors()
    parsed = COMPRESSION.parse(dict(config), "compression", errors)
    if errors:
        raise SpecError(errors)
    return parsed


def ddp_options(config: dict | str | None, backend: str) -> dict:
    """Extra DistributedDataParallel arguments a method needs.

    torch's PowerSGD hook blocks inside a completion callback on its next
    all_reduce. On gloo, callbacks run on the group's worker threads: with two
    buckets in flight they block each other (a deadlock no timeout ends), and
    with more threads the nested collectives are issued in a different order on
    each rank. One bucket (no overlap with the backward pass) is what works.
    """
    c = validate_config(config)
    if c["method"] == "powersgd" and backend == "gloo":
        return {"bucket_cap_mb": 100_000}
    return {}


def _powersgd_wire(state: powerSGD_hook.PowerSGDState, world: int):
    def wire(bucket: dist.GradBucket) -> float:
        n = bucket.buffer().numel()
        if state.iter < state.start_powerSGD_iter:
            return dense_allreduce_bytes(n, world)
        elements = 0
        for p in bucket.parameters():
            if p.dim() > 1:
                rows, cols = p.shape[0], p.numel() // p.shape[0]
                r = min(state.matrix_approximation_rank, rows, cols)
                compressed = (rows + cols) * r
                elements += compressed if compressed * state.min_compression_rate < rows * cols else p.numel()
            else:
                elements += p.numel()
        return dense_allreduce_bytes(elements, world)

    return wire


def register(model: torch.nn.parallel.DistributedDataParallel, config: dict | str | None = None,
             process_group: dist.ProcessGroup | None = None, seed: int = 0,
             momentum: float = 0.0, weight_decay: float = 0.0) -> MeasuredState:
    """Register the hook for ``config['method']`` on a DDP model; returns its state.

    ``momentum`` and ``weight_decay`` are the SGD optimizer's: a method with momentumCorrection applies
    them in the hook (memory.LocalMomentum), and the optimizer must then use ``state.optimizer_terms``.
    """
    c = validate_config(config)
    method = c["method"]
    world = dist.get_world_size(process_group)
    if method == "powersgd":
        inner = powerSGD_hook.PowerSGDState(
            process_group=process_group, matrix_approximation_rank=c["rank"],
            start_powerSGD_iter=c["startIter"], use_error_feedback=c["errorFeedback"], warm_start=True,
            random_seed=seed)
        state: MeasuredState = TorchHookState(powerSGD_hook.powerSGD_hook, inner,
                                                 _powersgd_wire(inner, world), process_group)
        model.register_comm_hook(state, torch_hook)
        return state
    if method == "fp16":
        state = TorchHookState(default_hooks.fp16_compress_hook, process_group,
                               lambda b: dense_allreduce_bytes(b.buffer().numel(), world, fp16=True),
                               process_group, fp16=True, always_dense=True)
        model.register_comm_hook(state, torch_hook)
        return state
    numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
    policy = {
        "allreduce": lambda: None,
        "topk": lambda: FixedDensity(c["density"]),
        "netsense": lambda: PaperAIMD(
            alpha=c["alpha"], beta=c["beta"], fraction=c["bdpFraction"], initial=c["initialRatio"],
            min_ratio=c["minRatio"], max_ratio=c["maxRatio"], startup=c["startup"], window=c["window"],
            quantize=c["quantize"], trq=c["trq"], trd=c["trd"], prune_factor=c["pruneFactor"]),
        "dc2": lambda: DelayDriven(numel, world, target=c["delayTarget"], gain=c["gain"],
                                   min_density=c["minDensity"]),
        "tta": lambda: TimeToAccuracyController(
            numel, world, knee=c["kneeDensity"], learn_knee=c["learnKnee"], window=c["window"],
            probe_every=c["probeEvery"],
            probe_gain=c["probeGain"], min_density=c["minDensity"], adaptive_probing=c["adaptiveProbing"]),
    }[method]()
    if policy is not None and next(model.parameters()).device.type == "cpu":
        native.library()  # build or load the sparse kernels now, not inside the first step
    # allreduce has neither setting, and without sparse steps neither matters.
    local = (LocalMomentum(momentum, weight_decay, masking=c["momentumMasking"])
             if c.get("momentumCorrection") and momentum > 0 else None)
    state = CompressionState(policy, process_group, error_feedback=c.get("errorFeedback", False),
                             warmup_steps=c.get("warmupSteps", 0), need_grad_stats=method == "netsense" and c["quantize"],
                             seed=seed, measure_progress=method == "tta" and c["learnKnee"], momentum=local)
    model.register_comm_hook(state, compress_hook)
    return state
