"""What the simulated clock takes as measured inputs (netsense.clock.simulated): a step's compute and the
compressor's work per element, each measured once on this machine before training, on rank 0, and broadcast,
so every rank's clock runs on the same numbers. Recorded in result.json; a re-run given them
(spec.network.simulation) reproduces the run bit for bit."""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from netsense.compression.selection import topk_indices

WARMUP, TIMED = 2, 7


def _median_seconds(run: Callable[[], object]) -> float:
    """The median time of TIMED calls of ``run`` after WARMUP untimed ones."""
    for _ in range(WARMUP):
        run()
    times = []
    for _ in range(TIMED):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


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
    twin = copy.deepcopy(model)
    opt = optimizer(twin.parameters(), training) if training is not None else None

    def step() -> None:
        twin.zero_grad(set_to_none=False)
        F.cross_entropy(twin(x), y).backward()
        if opt is not None:
            opt.step()

    seconds = _median_seconds(step)
    torch.set_rng_state(rng)
    return seconds


def compression_seconds_per_melement(numel: int, density: float = 0.01) -> float:
    """The median time of TopK's selection (netsense.compression.selection) of ``density`` of ``numel``
    elements, per million elements."""
    g = torch.Generator().manual_seed(0)
    values = torch.randn(numel, generator=g)
    k = max(1, int(density * numel))
    return _median_seconds(lambda: topk_indices(values.abs(), k, g)) / (numel / 1e6)


def inputs(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, training: dict) -> tuple[float, float]:
    """(computeSeconds, compressionSecondsPerMelement) of ``model`` trained as ``training`` on the batch (x, y)."""
    numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return compute_seconds(model, x, y, training), compression_seconds_per_melement(numel)


def inputs_for(training: dict) -> tuple[float, float]:
    """(computeSeconds, compressionSecondsPerMelement) of a job's training (spec.training, parsed), measured
    here on one thread: what netsense bench gives every simulated cell of a task, measured once before any runs
    (cells side by side would each measure the others' load)."""
    from netsense.train.data import load_dataset
    from netsense.train.models import build_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        data = load_dataset(training)
        torch.manual_seed(training["seed"])
        model = build_model(training["model"], data.input_shape, data.classes, training["hiddenSize"])
        return inputs(model, data.train_x[:training["batchSize"]], data.train_y[:training["batchSize"]], training)
    finally:
        torch.set_num_threads(threads)
