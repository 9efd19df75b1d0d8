"""Device profiles for the simulated clock: what a step of a known model costs on an accelerator we measured,
so a study can ask "ResNet18 at batch 32 on an H200 over a 200 Mbit link" on a machine without one.

A profile gives the simulated clock's two measured inputs (spec.network.simulation): a step's forward and
backward pass (``computeSeconds``) and the compressor's own work per million elements (``compressionSeconds
PerMelement``). It holds for the model, the batch and the input it was measured at; the spec refuses a job
whose model or batch differs (netsense.spec.job). The training itself still runs here, on the CPU: only the
clock says it ran on the device.

Every number comes from a committed record. Add a row only from one: a GPU check run
(testbed/gpu/check.sh) writes the step and the selection figures this table takes (its device-profile step: all
three of the clock's inputs, PowerSGD's included, per model and batch)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceProfile:
    model: str
    batch_size: int  # per worker
    datasets: tuple[str, ...]  # the inputs of the measured shape
    compute_seconds: float
    compression_seconds_per_melement: float
    source: str


_H200 = ("testbed/results/gpu-check-h200.jsonl, run 3 (testbed/bench_selection.py --device cuda, batch 32 of "
         "3x32x32 inputs, 100 classes, the PyTorch path): ")
_IMAGES_32 = ("cifar10", "cifar100", "synthetic")  # 3x32x32 inputs; the class count changes only the last layer

PROFILES: dict[str, DeviceProfile] = {
    # TopK at density 0.01: select 1.048 ms + decode 0.083 ms over 11,227,812 elements
    "resnet18-b32-h200": DeviceProfile("resnet18", 32, _IMAGES_32, 4.938e-3, 1.131e-3 / 11.227812,
                                       _H200 + "compute step 4.938 ms; TopK select + decode 1.131 ms over 11.2M "
                                               "elements"),
    # TopK at density 0.01: select 1.055 ms + decode 0.083 ms over 14,774,436 elements
    "vgg16-b32-h200": DeviceProfile("vgg16", 32, _IMAGES_32, 5.290e-3, 1.138e-3 / 14.774436,
                                    _H200 + "compute step 5.290 ms; TopK select + decode 1.138 ms over 14.8M "
                                            "elements"),
}


def mismatch(name: str, model: str, batch_size: int, dataset: str) -> str | None:
    """Why ``name``'s figures do not hold for this training, or None when they do."""
    p = PROFILES[name]
    if model != p.model:
        return f"{name} was measured for model {p.model}, not {model}"
    if batch_size != p.batch_size:
        return f"{name} was measured at batchSize {p.batch_size} a worker, not {batch_size}"
    if dataset not in p.datasets:
        return f"{name} was measured on 3x32x32 inputs ({', '.join(p.datasets)}), not {dataset}"
    return None


INPUTS = ("computeSeconds", "compressionSecondsPerMelement", "lowRankSecondsPerMelement")


def given_inputs(simulation: dict) -> tuple[float | None, float | None, float | None]:
    """spec.network.simulation's INPUTS: each as written, else its device profile's, else None (to be
    measured). A profile has no figure of PowerSGD's own: its TopK figure prices both paths (stated in the
    spec)."""
    p = PROFILES.get(simulation.get("device") or "")
    compute = simulation.get("computeSeconds", p and p.compute_seconds)
    per_melement = simulation.get("compressionSecondsPerMelement", p and p.compression_seconds_per_melement)
    lowrank = simulation.get("lowRankSecondsPerMelement", p and p.compression_seconds_per_melement)
    return compute, per_melement, lowrank
