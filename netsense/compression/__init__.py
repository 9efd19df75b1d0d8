"""Gradient compression for PyTorch DDP, selected by name.

    from netsense.compression import register
    state = register(ddp_model, {"method": "topk", "density": 0.01})
    ...                      # train as usual
    state.end_step()         # optional: this step's record (density, wire bytes, ...); all: state.history
    state.finish()           # after the last step, before destroy_process_group()

With ``momentumCorrection`` (topk, dc2, tta) pass the SGD momentum and weight decay to
``register``, which applies them inside the hook; build the optimizer with
``state.optimizer_terms(momentum, weight_decay)`` (zeros when the hook owns them).

Methods: allreduce (plain DDP), fp16 (torch's hook), powersgd (PowerSGD in our hook: lowrank.py), topk
(fixed density), netsense (paper-faithful NetSenseML), tta (ours: the density
that minimizes the predicted time to accuracy; "overlap" and "ours" are its old
names). Configuration uses the NetSenseJob's ``spec.compression`` names and is
validated by the same schema, so a bad value, or a setting of another method,
fails at once naming the field.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from netsense.clock import REAL, RealClock
from netsense.compression import native, warm
from netsense.compression.hooks import CompressionState, TorchHookState, compress_hook, torch_hook
from netsense.compression.lowrank import layout
from netsense.compression.memory import LocalMomentum, SharedMomentum
from netsense.compression.steps import MeasuredState
from netsense.control import penalties
from netsense.control.aimd import PaperAIMD
from netsense.control.cost import dense_allreduce_bytes
from netsense.control.delay import DelayDriven
from netsense.control.fixed import FixedDensity, FixedLowRank
from netsense.control.penalties import Penalties
from netsense.control.tta import TimeToAccuracyController
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
    """Extra DistributedDataParallel arguments a method needs: none now. (torch's PowerSGD hook blocked inside
    a completion callback and needed one bucket on gloo; ours waits for its first all_reduce in the hook
    itself, so every method keeps DDP's buckets and their overlap with the backward pass.)"""
    validate_config(config)
    return {}


def read_penalties(path: str | None) -> Penalties | None:
    """tta's penalties profile (spec.compression.penalties), read by each worker; a file gone or broken since the
    job was loaded is the job's error, naming the field."""
    if not path:
        return None
    from netsense.spec.job import SpecError
    from netsense.spec.schema import Issue

    try:
        return penalties.load(path)
    except penalties.PenaltiesError as e:
        raise SpecError([Issue("compression.penalties", str(e))]) from None


def register(model: torch.nn.parallel.DistributedDataParallel, config: dict | str | None = None,
             process_group: dist.ProcessGroup | None = None, seed: int = 0,
             momentum: float = 0.0, weight_decay: float = 0.0, null_wire: bool = False,
             clock: RealClock | None = None, reading=None) -> MeasuredState:
    """Register the hook for ``config['method']`` on a DDP model; returns its state.

    ``momentum`` and ``weight_decay`` are the SGD optimizer's: a method with momentumCorrection applies
    them in the hook (memory.LocalMomentum), and the optimizer must then use ``state.optimizer_terms``.
    ``null_wire``: the collectives move no bytes (communicator.py; benchmarks only: the ranks do not train as
    one model). ``clock``: what a step costs in time (netsense.clock; default the real one). ``reading``: a
    netsense.train.reading.Reading shown each bucket's gradient before the hook changes it (a study's trace).
    """
    c = validate_config(config)
    method = c["method"]
    world = dist.get_world_size(process_group)
    if method == "fp16":
        if null_wire:
            raise ValueError("null_wire: method fp16 runs torch's own hook and collective")
        state: MeasuredState = TorchHookState(default_hooks.fp16_compress_hook, process_group,
                               lambda b: dense_allreduce_bytes(b.buffer().numel(), world, fp16=True),
                               process_group, fp16=True, always_dense=True)
        state.clock = clock or REAL
        model.register_comm_hook(state, _read_first(torch_hook, reading))
        return state
    shapes = [tuple(p.shape) for p in model.parameters() if p.requires_grad]
    numel = sum(math.prod(shape) for shape in shapes)
    policy = {
        "allreduce": lambda: None,
        "topk": lambda: FixedDensity(c["density"], fp16=c["values"] == "fp16"),
        "powersgd": lambda: FixedLowRank(c["rank"], fp16=c["values"] == "fp16"),
        "netsense": lambda: PaperAIMD(
            alpha=c["alpha"], beta=c["beta"], fraction=c["bdpFraction"], initial=c["initialRatio"],
            min_ratio=c["minRatio"], max_ratio=c["maxRatio"], startup=c["startup"], window=c["window"],
            quantize=c["quantize"], trq=c["trq"], trd=c["trd"], prune_factor=c["pruneFactor"]),
        "dc2": lambda: DelayDriven(numel, world, target=c["delayTarget"], gain=c["gain"], fp16=c["values"] == "fp16",
                                   min_density=c["minDensity"]),
        "tta": lambda: TimeToAccuracyController(
            numel, world, fp16=c["values"] == "fp16", knee=c["kneeDensity"], window=c["window"],
            probe_every=c["probeEvery"],
            probe_gain=c["probeGain"], min_density=c["minDensity"], adaptive_probing=c["adaptiveProbing"],
            low_ranks={r: layout(shapes, r) for r in c["lowRanks"]}, lowrank_knee=c["lowRankKnee"],
            step_law=c["stepLaw"], density_exponent=c["densityExponent"], probe_padding=c["probePadding"],
            penalties=read_penalties(c.get("penalties"))),
    }[method]()
    if policy is not None and next(model.parameters()).device.type == "cpu":
        native.library()  # build or load the sparse kernels now, not inside the first step
    # allreduce has neither setting, and without sparse steps neither matters.
    local = (LocalMomentum(momentum, weight_decay, masking=c.get("momentumMasking", False))
             if c.get("momentumCorrection") and momentum > 0 else None)
    # tta's PowerSGD steps take their momentum after the all-reduce unless asked otherwise (SharedMomentum).
    shared = (SharedMomentum(momentum, weight_decay)
              if local is not None and c.get("lowRanks") and not c["lowRankMomentumCorrection"] else None)
    state = CompressionState(policy, process_group, error_feedback=c.get("errorFeedback", False),
                             warmup_steps=c.get("warmupSteps", c.get("startIter", 0)), need_grad_stats=method == "netsense" and c["quantize"],
                             seed=seed, momentum=local,
                             shared=shared, null_wire=null_wire, selection=c.get("selection", "exact"))
    state.clock = clock or REAL
    device = next(model.parameters()).device
    if method in ("topk", "netsense", "dc2", "tta") and device.type == "cuda":  # kernels loaded now (warm.py)
        fp16s = (True, False) if method == "netsense" else (c["values"] == "fp16",)
        densities = sorted({*warm.DENSITIES, *([c["density"]] if method == "topk" else [])})
        state.warmed = warm.warm(state.topk.selection, warm.bucket_sizes(model), device, densities, fp16s, world)
    model.register_comm_hook(state, _read_first(compress_hook, reading))
    return state


def _read_first(hook, reading):
    """``hook``, with ``reading`` shown each bucket's gradient first (as computed: nothing has changed it yet)."""
    if reading is None:
        return hook

    def read_then_hook(state, bucket):
        reading.observe(bucket.index(), bucket.buffer(), bucket.gradients(), bucket.parameters())
        return hook(state, bucket)
    return read_then_hook
