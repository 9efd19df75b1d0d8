"""What the simulated clock takes as measured inputs (netsense.clock.simulated): a step's compute and the
compressor's work per element on each of its two paths (TopK's, PowerSGD's), each measured once on this machine before training, on rank 0, and broadcast,
so every rank's clock runs on the same numbers. Recorded in result.json; a re-run given them
(spec.network.simulation) reproduces the run bit for bit."""

from __future__ import annotations

import copy
import math
import statistics
import time
from collections.abc import Callable

import torch

from netsense.train.models import cross_entropy

WARMUP, TIMED = 3, 7
SPAN, MOST = 1.0, 41  # timed calls go on until SPAN seconds of them (at most MOST): a 45 ms CNN step's median of 7
# read 35-48 ms from one measurement to the next (testbed/results/sim-training.md); of 21, a few percent


def _finished(run: Callable[[], object], device: torch.device) -> Callable[[], None]:
    """``run``, returning once its work is done: on CUDA the kernels it queued have finished, so the wall
    clock around a call times the work and not its launch."""
    if device.type != "cuda":
        return run

    def synced() -> None:
        run()
        torch.cuda.synchronize(device)
    return synced


def _median_seconds(run: Callable[[], object]) -> float:
    """The median time of at least TIMED calls of ``run`` (more, up to MOST, until SPAN seconds of them) after
    WARMUP untimed ones."""
    for _ in range(WARMUP):
        run()
    times: list[float] = []
    while len(times) < TIMED or (sum(times) < SPAN and len(times) < MOST):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _median_beyond(run: Callable[[], object], baseline: Callable[[], object]) -> float:
    """The median time of ``run`` less the median of ``baseline`` (its setup), timed in turns within one window
    (as _median_seconds) so that both see the same load: a fast baseline timed alone fits in one time slice of a
    busy machine and can read as long as the run itself."""
    for _ in range(WARMUP):
        baseline()
        run()
    runs: list[float] = []
    bases: list[float] = []
    while len(runs) < TIMED or (sum(runs) + sum(bases) < SPAN and len(runs) < MOST):
        for f, times in ((baseline, bases), (run, runs)):
            t0 = time.perf_counter()
            f()
            times.append(time.perf_counter() - t0)
    return max(0.0, statistics.median(runs) - statistics.median(bases))


def optimizer(params, training: dict) -> torch.optim.Optimizer:
    """The job's optimizer as the trainer builds it without a hook (spec.training: optimizer, lr, momentum,
    weightDecay). With momentum correction the hook applies the momentum and the weight decay instead of SGD:
    the same passes over the gradient, in another place of the step."""
    if training.get("optimizer", "sgd") == "adam":
        return torch.optim.Adam(params, lr=training.get("lr", 0.05), weight_decay=training.get("weightDecay", 0.0))
    return torch.optim.SGD(params, lr=training.get("lr", 0.05), momentum=training.get("momentum", 0.0),
                           weight_decay=training.get("weightDecay", 0.0))


def compute_seconds(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, training: dict | None = None) -> float:
    """The median of TIMED warm training steps of a copy of ``model`` on one batch: the forward and backward
    passes and, given the job's ``training``, its optimizer's step (SGD's momentum and weight decay are passes
    over every parameter: 3.1 -> 4.6 ms a step of the digits MLP on this machine, where the emulated runs of
    PowerSGD, whose hook adds no pass of its own, read 4.6-5.3 ms of compute; testbed/results/sim-training.md). The model and the RNG are left as
    they were: the training that follows is the one it would have been."""
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state(x.device) if x.device.type == "cuda" else None
    twin = copy.deepcopy(model)
    opt = optimizer(twin.parameters(), training) if training is not None else None

    def step() -> None:
        twin.zero_grad(set_to_none=False)
        cross_entropy(twin(x), y).backward()  # the trainer's loss: a sequence model's too
        if opt is not None:
            opt.step()

    seconds = _median_seconds(_finished(step, x.device))
    torch.set_rng_state(rng)
    if cuda_rng is not None:
        torch.cuda.set_rng_state(cuda_rng, x.device)
    return seconds


class _WholeBucket:
    """What the hook reads of a DDP GradBucket (index, flat buffer, the parameters' views into it), for the
    model's whole gradient as one bucket."""

    def __init__(self, params: list[torch.Tensor], grad: torch.Tensor):
        self._params, self._buf = params, grad
        self._views = [v.view_as(p) for v, p in zip(grad.split([p.numel() for p in params]), params, strict=True)]

    def index(self) -> int:
        return 0

    def buffer(self) -> torch.Tensor:
        return self._buf

    def gradients(self) -> list[torch.Tensor]:
        return self._views

    def parameters(self) -> list[torch.Tensor]:
        return self._params


def path_settings(compression: dict) -> dict:
    """What a job's compression (spec.compression, parsed) sets of the two paths' work: the values' encoding,
    error feedback, TopK's density (1% where the method chooses it) and PowerSGD's rank (the job's, tta's
    largest low rank, else 4)."""
    ranks = compression.get("lowRanks") or [compression.get("rank", 4)]
    return {"fp16": compression.get("values", "fp16") == "fp16",
            "errorFeedback": compression.get("errorFeedback", True),
            "density": compression.get("density", 0.01) if compression.get("method") == "topk" else 0.01,
            "rank": max(ranks)}


def path_seconds(params: list[torch.Tensor], settings: dict, world: int) -> tuple[float, float]:
    """(TopK's path, PowerSGD's path) per million gradient elements: the median time of the hook's own local
    work for one step of each (netsense.compression.hooks: CompressionState.sparse and .low_rank, without their
    collectives; keep the two in step), on a random gradient of ``params``' shape as one bucket, ``world``
    ranks' chunks decoded. TopK: error feedback, exact selection and packing (the native kernels where the
    hook uses them), decoding ``world`` chunks. PowerSGD: error feedback, P = M Q, the casts to and from the
    wire, the orthogonalization, Q = M^T P^, applying the factors. Not in it: momentum correction's pass (it
    replaces the optimizer's momentum, which computeSeconds holds) and a bucket's fixed costs (one bucket here,
    DDP's few there)."""
    from netsense.compression.compressor import TopK
    from netsense.compression.lowrank import LowRank, from_wire, to_wire
    from netsense.compression.memory import ResidualMemory

    params = [p for p in params if p.requires_grad]
    numel = sum(p.numel() for p in params)
    grad = torch.randn(numel, generator=torch.Generator().manual_seed(0)).to(params[0].device)
    bucket = _WholeBucket(params, grad.clone())
    buf, views = bucket.buffer(), bucket.gradients()
    fp16, k, rank = settings["fp16"], max(1, math.ceil(settings["density"] * numel)), settings["rank"]
    topk, lowrank = TopK(0, 0), LowRank(0)
    memory = ResidualMemory() if settings["errorFeedback"] else None

    def sparse() -> None:
        buf.copy_(grad)
        packed = topk.compress(bucket, k, fp16, 0.0, memory)
        TopK.decompress(buf, [packed] * world, k, fp16, world)

    def low_rank() -> None:
        buf.copy_(grad)
        signal = memory.compensate(0, buf, views, params) if memory is not None else buf
        pieces = LowRank.pieces(buf, views, params, rank)
        first, mats = lowrank.first_pass(signal, pieces, rank)
        first = from_wire(to_wire(first, world, fp16), first, world, fp16)
        second, hats, vectors = lowrank.second_pass(first, mats, pieces, rank)
        second = from_wire(to_wire(second, world, fp16), second, world, fp16)
        lowrank.apply(buf, signal if memory is not None else None, pieces, hats, second, vectors, world, rank)

    def copying() -> None:  # each call's fresh gradient: not the path's work
        buf.copy_(grad)

    per_melement = numel / 1e6
    device = grad.device
    return tuple(_median_beyond(_finished(path, device), _finished(copying, device)) / per_melement
                 for path in (sparse, low_rank))


def inputs(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, training: dict, compression: dict,
           world: int, compute: float | None = None) -> tuple[float, float, float]:
    """(computeSeconds, compressionSecondsPerMelement, lowRankSecondsPerMelement) of ``model`` trained as
    ``training`` on the batch (x, y), compressed as ``compression`` among ``world`` ranks (``compute``: already
    measured, not again)."""
    params = list(model.parameters())
    if compute is None:
        compute = compute_seconds(model, x, y, training)
    return (compute, *path_seconds(params, path_settings(compression), world))


def inputs_for(training: dict, compression: dict, world: int, compute: float | None = None,
               device: str = "cpu") -> tuple[float, float, float]:
    """``inputs`` of a job's training and compression (spec.training and .compression, parsed) among ``world``
    ranks, measured here on one thread: what netsense bench gives every simulated cell of a task, measured once
    before any runs (cells side by side would each measure the others' load). ``device``: where the model and
    the batch are put (the GPU check's device profile measures on CUDA)."""
    from netsense.train.data import load_dataset
    from netsense.train.models import build_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        data = load_dataset(training)
        torch.manual_seed(training["seed"])
        model = build_model(training["model"], data.input_shape, data.classes, training["hiddenSize"]).to(device)
        b = training["batchSize"]
        return inputs(model, data.train_x[:b].to(device), data.train_y[:b].to(device), training, compression, world,
                      compute)
    finally:
        torch.set_num_threads(threads)
