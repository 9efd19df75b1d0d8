"""The NetSenseJob: its schema (the one source of truth) and loading.

Importable without torch or a cluster: the CLI, the CRD generator, the operator
and the local runner all validate through :func:`parse_job`.
"""

from __future__ import annotations

import csv
import os
import re
from dataclasses import dataclass
from typing import Any

import yaml

from netsense import units
from netsense.clock import devices
from netsense.errors import BadInput
from netsense.spec import podtemplate
from netsense.spec.schema import (
    MISSING,
    Bool,
    Errors,
    F,
    Float,
    Free,
    Int,
    Issue,
    ListOf,
    Obj,
    Str,
    Union,
    Unit,
    _join,
)

GROUP = "netsense.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "NetSenseJob"
PLURAL = "netsensejobs"
SHORT_NAME = "nsj"
DEFAULT_IMAGE = "netsense/worker:0.1.0"  # the operator's fallback; its install names the real one

MODELS = ("resnet18", "resnet18-cifar", "vgg16", "mlp", "cnn", "cnn1d", "allconv1d", "transformer1d", "gru1d", "gpt")
DATASETS = ("cifar10", "cifar100", "digits", "digits32", "mnist1d", "synthetic", "pysource")
# tta settings tried and not adopted, removed (issue 62, item 4; git keeps them): field -> (its old default, what it
# was). The last commit with them is REMOVED_AT. At its old default a field changed nothing and is accepted and
# dropped (a job a cluster recorded with every default filled in still parses); any other value is refused by name. A
# committed grid that ran with one says so (``ranAt``: netsense.bench.grid).
REMOVED_TTA = {
    "learnKnee": (False, "the knee learned from each sparse update's progress: slower than the fixed prior on set 3 "
                         "(eval3)"),
    "familyPilot": (False, "a TopK and a PowerSGD fork before training to scale TopK's prior: read nothing on 5 of 6 "
                           "fresh tasks"),
    "familyPilotExponent": (1.70, "the family pilot's reading -> steps ratio exponent"),
    "convTopkPrior": (1.0, "TopK's prior x this on models with convolutions: 0.98 and 1.11x the time without it on the "
                           "third fresh set"),
    # Item 5's: the bound on probes is always on now (2 ordinary steps at the rate the link held lately).
    "probeCap": (False, "a probe at most 4 ordinary steps at the peak rate: not adopted on dev-probecap-set2..5; every "
                        "probe is bounded now (issue 62, item 5)"),
}
REMOVED_AT = "8e920e0fa63780cfa321c8a96695848134075ecf"
SIGNAL_ONLY_MODELS = ("cnn1d", "allconv1d", "transformer1d", "gru1d")  # MNIST-1D's 1-D signals and nothing else
SIGNAL_MODELS = ("mlp", *SIGNAL_ONLY_MODELS)  # what takes MNIST-1D's 1-D signals (the others take images)
TEXT_MODELS = ("gpt",)  # take pysource's tokens, and pysource takes nothing else
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


# ---- bandwidth profiles ------------------------------------------------------------

def _impairments() -> dict[str, F]:
    """delay/jitter/loss: netem, available only where the kernel has it."""
    return {
        "delay": F(Unit("duration", doc="added one-way delay (netem), e.g. 5ms")),
        "jitter": F(Unit("duration", doc="delay variation (netem), e.g. 1ms")),
        "loss": F(Unit("percent", doc="random loss (netem), e.g. 0.1%")),
    }


def _check_steps(p: dict, path: str, errors: Errors) -> None:
    listed = "steps" in p
    generated = [k for k in ("from", "to", "by", "every") if k in p]
    if listed == bool(generated):
        errors.add(path, "give either 'steps' (a list of {at, rate}) or all of from/to/by/every")
        return
    if generated and len(generated) != 4:
        missing = sorted({"from", "to", "by", "every"} - set(generated))
        errors.add(path, f"the generator form needs from, to, by and every (missing: {', '.join(missing)})")
        return
    if listed:
        ats = [units.parse_duration(s["at"]) for s in p["steps"]]
        if ats[0] != 0:
            errors.add(f"{path}.steps[0].at", "the first step must be at 0s (training never starts unshaped)")
        for i in range(1, len(ats)):
            if ats[i] <= ats[i - 1]:
                errors.add(f"{path}.steps[{i}].at", "steps must be in strictly increasing time order")
    elif units.parse_duration(p["every"]) <= 0:
        errors.add(f"{path}.every", "must be longer than 0s")


def _check_fluctuating(p: dict, path: str, errors: Errors) -> None:
    if units.parse_rate(p["min"]) > units.parse_rate(p["max"]):
        errors.add(f"{path}.min", f"must not exceed max ({p['max']})")
    if units.parse_duration(p["period"]) <= 0:
        errors.add(f"{path}.period", "must be longer than 0s")


def _check_trace(p: dict, path: str, errors: Errors) -> None:
    if ("file" in p) == ("points" in p):
        errors.add(path, "give either 'file' (a CSV/YAML of t,rate) or inline 'points'")
    elif "points" in p:
        _check_steps({"steps": p["points"]}, path.rstrip("."), errors)


# Bounds the API server needs to price the CRD's rules on each point (CEL's cost budget); a longer trace is
# resampled, or looped (loop: true).
MAX_STEPS = 1_000
MAX_POINTS = 10_000
_STEP = Obj({"at": F(Unit("duration"), required=True), "rate": F(Unit("rate"), required=True)})

PROFILE = Union("type", {
    "static": Obj({"rate": F(Unit("rate", doc="e.g. 200Mbit"), required=True), **_impairments()}),
    "steps": Obj({
        "steps": F(ListOf(_STEP, min_items=1, max_items=MAX_STEPS, doc="explicit (at, rate) list")),
        "from": F(Unit("rate", doc="generator: first rate")),
        "to": F(Unit("rate", doc="generator: last rate")),
        "by": F(Unit("rate", doc="generator: change per step")),
        "every": F(Unit("duration", doc="generator: time between steps")),
        **_impairments(),
    }, checks=[_check_steps], cel=[
        {"rule": "has(self.steps) != (has(self.from) && has(self.to) && has(self.by) && has(self.every))",
         "message": "give either steps or all of from/to/by/every"}]),
    "fluctuating": Obj({
        "min": F(Unit("rate"), required=True),
        "max": F(Unit("rate"), required=True),
        "period": F(Unit("duration", doc="time between changes (random) or cycle length (sine)"), default="30s"),
        "seed": F(Int(min=0), default=0),
        "shape": F(Str(enum=("random", "sine")), default="random"),
        **_impairments(),
    }, checks=[_check_fluctuating]),
    "trace": Obj({
        "file": F(Str(doc="CSV (t,rate) or YAML list of {at, rate}; local runs only")),
        "points": F(ListOf(_STEP, min_items=1, max_items=MAX_POINTS, doc="inline trace")),
        "loop": F(Bool(), default=False),
        **_impairments(),
    }, checks=[_check_trace], cel=[
        {"rule": "has(self.file) != has(self.points)", "message": "give either file or points"}]),
}, doc="bandwidth over time: static, steps, fluctuating or trace")


# ---- the job -----------------------------------------------------------------------

def _check_training(t: dict, path: str, errors: Errors) -> None:
    if not any(k in t for k in ("epochs", "maxSteps", "maxSeconds")):
        t["epochs"] = 1
    if "maxSeconds" in t and units.parse_duration(t["maxSeconds"]) <= 0:
        errors.add(f"{path}.maxSeconds", "must be longer than 0s")
    model, dataset = t.get("model"), t.get("dataset")
    if (dataset == "pysource") != (model in TEXT_MODELS):
        errors.add(f"{path}.model", f"dataset pysource (text) takes model {' or '.join(TEXT_MODELS)} and "
                                    f"{' or '.join(TEXT_MODELS)} takes nothing else (got {model} on {dataset})")
    elif dataset == "mnist1d" and model not in SIGNAL_MODELS:
        errors.add(f"{path}.model", f"mnist1d's 1-D signals take model {' or '.join(SIGNAL_MODELS)} (got {model})")
    elif model in SIGNAL_ONLY_MODELS and dataset != "mnist1d":
        errors.add(f"{path}.model", f"{model} takes 1-D signals: use it with dataset mnist1d (got {dataset})")
    if "targetAccuracy" in t and "targetLoss" in t:
        errors.add(f"{path}.targetLoss", "give one target, targetAccuracy or targetLoss, not both: a run has one "
                                         "time to target (time_to_accuracy_s) and stops at one")
    if t.get("backend") == "nccl" and t.get("device") == "cpu":
        errors.add(f"{path}.device", "backend nccl moves only CUDA tensors: use device cuda (or auto), or backend gloo")


def _check_momentum(c: dict, path: str, errors: Errors) -> None:
    if c.get("momentumMasking") and not c.get("momentumCorrection"):
        errors.add(f"{path}.momentumMasking", "needs momentumCorrection: masking forgets the momentum the hook "
                                              "keeps, and without correction the optimizer keeps it")


def _check_lowrank_momentum(spec: dict, path: str, errors: Errors) -> None:
    c, t = spec.get("compression") or {}, spec.get("training") or {}
    momentum = t.get("optimizer") == "sgd" and t.get("momentum", 0) > 0  # else the hook has none to move
    if (c.get("method") == "tta" and c.get("lowRanks") and c.get("momentumCorrection") and momentum
            and not c.get("lowRankMomentumCorrection") and not c.get("errorFeedback")):
        errors.add(_join(path, "compression.lowRankMomentumCorrection"),
                   "false (the default) moves each rank's velocity into its residual when PowerSGD takes over: "
                   "needs errorFeedback (or set it true, or lowRanks: [] for TopK and dense only)")


def _check_null_wire(spec: dict, path: str, errors: Errors) -> None:
    c, t = spec.get("compression") or {}, spec.get("training") or {}
    if t.get("nullWire") and c.get("method") == "fp16":
        errors.add(_join(path, "training.nullWire"), "method fp16 runs torch's own hook and collective: "
                                                     "it cannot run without the wire")


def _check_simulated(spec: dict, path: str, errors: Errors) -> None:
    n = spec.get("network") or {}
    if n.get("clock") == "simulated" and (spec.get("training") or {}).get("threads", 1) != 1:
        errors.add(_join(path, "training.threads"), "the simulated clock runs one thread a worker (so that a run "
                                                    "is the same bit for bit): leave it at 1")
    device = (n.get("simulation") or {}).get("device")
    if device in devices.PROFILES:
        t = spec.get("training") or {}
        why = devices.mismatch(device, t.get("model"), t.get("batchSize"), t.get("dataset"))
        if why:
            errors.add(_join(path, "network.simulation.device"), why)


def _check_netsense(c: dict, path: str, errors: Errors) -> None:
    if not c["minRatio"] <= c["initialRatio"] <= c["maxRatio"]:
        errors.add(f"{path}.initialRatio", "must lie between minRatio and maxRatio")


TRAINING = Obj({
    "model": F(Str(enum=MODELS), default="resnet18"),
    "dataset": F(Str(enum=DATASETS), default="synthetic"),
    "dataPath": F(Str(doc="directory in torchvision's CIFAR format (cifar10/cifar100)"), default="/data"),
    "batchSize": F(Int(min=1, doc="per worker"), default=32),
    "epochs": F(Int(min=1)),
    "maxSteps": F(Int(min=1)),
    "maxSeconds": F(Unit("duration", bare_seconds=True, doc="budget of training time: '30s', '2m' (a bare "
                         "number: seconds)")),
    "optimizer": F(Str(enum=("sgd", "adam")), default="sgd"),
    "lr": F(Float(min=0, exclusive_min=True), default=0.05),
    "momentum": F(Float(min=0, max=1), default=0.9),
    "weightDecay": F(Float(min=0), default=5e-4),
    "seed": F(Int(min=0), default=0),
    "targetAccuracy": F(Float(min=0, max=1, exclusive_min=True, doc="the target: an evaluation's accuracy at or "
                              "above it (not with targetLoss)")),
    "targetLoss": F(Float(min=0, exclusive_min=True, doc="the target instead as a loss: an evaluation's mean "
                          "cross-entropy on the evaluation samples (per next token for gpt) at or below it (not "
                          "with targetAccuracy). result.json's time_to_accuracy_s is then the time to this loss, "
                          "and target_metric says loss")),
    "targetHold": F(Int(min=1, doc="evaluations in a row that meet the target (targetAccuracy or targetLoss) "
                        "before it counts as reached; the time to the target is the first of them (a single lucky "
                        "evaluation is not a result)"), default=3),
    "stopAtTarget": F(Bool(doc="stop once the target is reached (held targetHold evaluations)"), default=True),
    "minEpochs": F(Float(min=0, exclusive_min=True, doc="with stopAtTarget, train at least this many epochs "
                         "before stopping at the target (the budget still stops a run), so that the accuracy "
                         "after equal epochs can be read off every run")),
    "evalEvery": F(Int(min=1, doc="evaluate every N steps (default: every epoch)")),
    "evalSamples": F(Int(min=1), default=2000),
    "nullWire": F(Bool(doc="benchmarks only (a grid's contention-matched ceiling): every gradient collective "
                       "moves no bytes, each rank's own contribution standing in for the others' and a one-element "
                       "all_reduce keeping the ranks in step, so compression, error feedback and decoding still run "
                       "on every worker; the ranks do not train one model (DDP's own broadcast of batch-norm buffers "
                       "still runs). Not with method fp16 (torch's hook)"),
                  default=False),
    "readingSteps": F(Int(min=0, doc="study instrument: for the first N steps, record what each candidate "
                          "compressor (TopK 0.1/0.5/2%, PowerSGD rank 1/4) would keep of rank 0's gradient, in "
                          "result.json's reading (netsense.train.reading; its work is not priced by the simulated "
                          "clock, timed apart); it decides nothing: as a rule it failed its registered bar "
                          "(testbed/studies/reading/RESULTS.md); 0: off"), default=0),
    "threads": F(Int(min=1, max=256, doc="torch threads per worker"), default=1),
    "backend": F(Str(enum=("auto", "gloo", "nccl"), doc="auto: nccl where CUDA is, else gloo"), default="auto"),
    "device": F(Str(enum=("auto", "cpu", "cuda"), doc="auto: cuda with nccl, else cpu; cuda with gloo shares "
                    "one GPU among ranks (NCCL refuses two ranks on one device)"), default="auto"),
    "hiddenSize": F(Int(min=1, doc="width of the models, scaled per model (netsense.train.models): the mlp's "
                        "hidden layers; transformer1d's, gpt's and gru1d's width hiddenSize // 4"), default=512),
    "syntheticSamples": F(Int(min=1), default=4096),
    "mnist1dSamples": F(Int(min=100, doc="MNIST-1D samples made (80% train); 5000: the published set"),
                        default=5000),
    "syntheticClasses": F(Int(min=2), default=10),
    "contextLength": F(Int(min=2, max=4096, doc="pysource: the tokens (bytes) of a sample, gpt's context; each "
                           "window's next bytes are its targets"), default=64),
    "pysourceBytes": F(Int(min=10_000, max=16_000_000, doc="pysource: how much of the standard library's .py "
                           "sources to take (those of the Python running the trainer; files in sorted path order "
                           "without the tests, the encodings' tables and third-party packages; all of them where "
                           "they hold less, ~10 MB): the last tenth the validation set. The text differs between "
                           "Python versions: result.json's text.sha256 says which it was"), default=4_000_000),
}, checks=[_check_training], cel=[
    {"rule": "!(has(self.targetAccuracy) && has(self.targetLoss))",
     "message": "give one target, targetAccuracy or targetLoss, not both"}])

_ERROR_FEEDBACK = F(Bool(doc="keep what is not sent and add it to the next step's gradient"), default=True)
_WARMUP = F(Int(min=0, doc="dense steps before compressing"), default=0)
_MOMENTUM_CORRECTION = F(Bool(doc="apply SGD's momentum and weight decay to each rank's gradient before "
                              "compression (DGC's momentum correction) instead of in the optimizer after it: what "
                              "error feedback holds back is then sent once, not pushed on by the momentum "
                              "afterwards; no effect with Adam"), default=True)
_MOMENTUM_MASKING = F(Bool(doc="with momentumCorrection, forget the momentum of each coordinate sent (DGC's "
                           "momentum factor masking): less momentum where the gradient is largest, so it changes "
                           "the optimizer too"), default=False)
_WINDOW = F(Int(min=1, doc="steps in the BtlBw max / RTprop min filters"), default=10)
# One wire format (issue 62): every method with a ``values`` field (topk, dc2, tta, powersgd) sends fp16 unless
# told otherwise. allreduce (fp32) and fp16 (torch's hook) have fixed formats; netsense has its own fp16 gate.
VALUES_DEFAULT = "fp16"
_VALUES_SAME = (f"; {VALUES_DEFAULT} by default for every method with this field (topk, dc2, tta, powersgd: "
                "compare methods at the same encoding; netsense bench refuses a grid that mixes them); allreduce "
                "(fp32) and fp16 (torch's hook) have fixed formats, netsense its own fp16 gate (quantize)")


def _values(doc: str = "how a sparse step's values travel: fp32 (4 bytes) or fp16 (2), each with a 4-byte "
                       "index") -> F:
    return F(Str(enum=("fp32", "fp16"), doc=doc + _VALUES_SAME), default=VALUES_DEFAULT)


# How TopK's entries are found (issue 64). exact: the k largest, always (the native kernels on CPUs; on GPUs a
# path that reads counts back to the host); sampled: netsense/compression/sampled.py.
SELECTIONS = ("exact", "sampled")
_SELECTION = F(Str(enum=SELECTIONS,
                   doc="how a sparse step finds its k entries: exact (the k largest; on CPUs the fused kernels) or "
                       "sampled (a threshold from a random sample of the magnitudes, fixed-size outputs and no "
                       "host synchronization, for GPUs: the exact k largest except with probability under 2e-6 a "
                       "bucket and step, else the largest above the threshold with zero-valued padding, or a "
                       "truncation; error feedback keeps whatever is not sent: "
                       "netsense/compression/sampled.py)"), default="exact")

_MIN_DENSITY = F(Float(min=0, max=1, exclusive_min=True, doc="never send less than this fraction"), default=0.001)

# spec.compression.penalties on a cluster: "configmap:NAME", a ConfigMap of the job's namespace holding the profile
# under PENALTIES_KEY (netsense calibrate's penalties.json; what a calibrate job writes, <job>-penalties).
CONFIGMAP_PREFIX = "configmap:"
PENALTIES_KEY = "penalties.json"
_CONFIGMAP_NAME = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
PENALTIES_CEL = {"rule": f"!has(self.penalties) || !self.penalties.startsWith('{CONFIGMAP_PREFIX}') || "
                         f"(self.penalties.size() <= {len(CONFIGMAP_PREFIX) + 253} && "
                         f"self.penalties.matches('^{CONFIGMAP_PREFIX}{_CONFIGMAP_NAME}$'))",
                 "message": f"{CONFIGMAP_PREFIX}NAME names a ConfigMap: NAME is lower-case letters, digits, '-' and "
                            "'.' (at most 253 characters)", "fieldPath": ".penalties"}


def penalties_configmap(compression: dict) -> str | None:
    """The ConfigMap a job's penalties name (``configmap:NAME``), or None (none, or a local file)."""
    ref = compression.get("penalties")
    return ref[len(CONFIGMAP_PREFIX):] if isinstance(ref, str) and ref.startswith(CONFIGMAP_PREFIX) else None


def _check_penalties_ref(c: dict, path: str, errors: Errors) -> None:
    name = penalties_configmap(c)
    if name is not None and (len(name) > 253 or not re.match(f"^{_CONFIGMAP_NAME}$", name)):
        errors.add(_join(path, "penalties"), f"{c['penalties']!r}: {PENALTIES_CEL['message']}")


COMPRESSION = Union("method", {
    "allreduce": Obj({}, doc="plain DDP: the dense gradient, fp32"),
    "fp16": Obj({}, doc="torch's fp16 compression hook: the dense gradient as 16-bit values"),
    "powersgd": Obj({
        "rank": F(Int(min=1, doc="matrix approximation rank"), default=1),
        "values": _values("how the factors P and Q (and the parameters sent whole) travel: fp32 (4 bytes) or "
                          "fp16 (2, cast for the wire only: orthogonalized in fp32, divided by the workers before "
                          "the cast)"),
        "startIter": F(Int(min=0, doc="vanilla allreduce until this step (torch's meaning; none by default: "
                                      "the warm start and the residual follow their parameters through DDP's "
                                      "bucket rebuild)"), default=0),
        "errorFeedback": _ERROR_FEEDBACK,
        # Off by default (PowerSGD as published: momentum in the optimizer); on, it runs as tta's low-rank steps do.
        "momentumCorrection": F(_MOMENTUM_CORRECTION.node, default=False),
    }, doc="PowerSGD (Vogels et al. 2019), one power iteration a step with warm start, in our hook"),
    "topk": Obj({
        "density": F(Float(min=0, max=1, exclusive_min=True, doc="fraction of elements sent"), default=0.1),
        "values": _values(),
        "errorFeedback": _ERROR_FEEDBACK,
        "momentumCorrection": _MOMENTUM_CORRECTION,
        "momentumMasking": _MOMENTUM_MASKING,
        "warmupSteps": _WARMUP,
        "selection": _SELECTION,
    }, checks=[_check_momentum], doc="TopK at a fixed density"),
    "netsense": Obj({
        # The paper's method is published without error feedback: that is what `netsense` runs unless asked.
        "errorFeedback": F(Bool(doc="keep what is not sent and add it to the next step's gradient (not the "
                                    "paper's: an ablation)"), default=False),
        "warmupSteps": _WARMUP,
        "alpha": F(Float(min=0, max=1, exclusive_min=True, doc="multiplicative decrease"), default=0.5),
        "beta": F(Float(min=0, exclusive_min=True, doc="additive increase"), default=0.01),
        "bdpFraction": F(Float(min=0, exclusive_min=True, doc="decrease when payload > this x BDP"), default=0.9),
        # The paper's ratio: the payload as a fraction of the dense gradient's bytes. The TopK density is the
        # ratio, or twice it under fp16 (half the bytes per value).
        "initialRatio": F(Float(min=0, max=1, exclusive_min=True), default=0.01),
        "minRatio": F(Float(min=0, max=1, exclusive_min=True, doc="lowest ratio"), default=0.001),
        "maxRatio": F(Float(min=0, max=1, exclusive_min=True), default=1.0),
        "startup": F(Bool(doc="double the ratio until the first decrease"), default=True),
        "window": _WINDOW,
        "quantize": F(Bool(doc="the fp16 gate"), default=True),
        "trq": F(Float(min=0, max=1, doc="quantize when ratio < trq"), default=0.1),
        "trd": F(Float(min=0, doc="... and gradient L2 norm > trd"), default=1e-3),
        "pruneFactor": F(Float(min=0, max=1, doc="prune at pruneFactor*(1-ratio)"), default=0.5),
    }, checks=[_check_netsense], doc="the paper's NetSenseML: AIMD of the payload ratio against the sensed BDP"),
    "dc2": Obj({
        "values": _values(),
        "errorFeedback": _ERROR_FEEDBACK,
        "momentumCorrection": _MOMENTUM_CORRECTION,
        "momentumMasking": _MOMENTUM_MASKING,
        "warmupSteps": _WARMUP,
        "delayTarget": F(Float(min=0, exclusive_min=True,
                               doc="communication delay budget as a multiple of the step's compute time"),
                         default=1.0),
        "gain": F(Float(min=0, max=1, exclusive_min=True, doc="exponent of the multiplicative update (damping)"),
                  default=0.5),
        "minDensity": _MIN_DENSITY,
        "selection": _SELECTION,
    }, checks=[_check_momentum], doc="a delay-driven peer after DC2 (INFOCOM 2021): TopK density steered to keep the collectives' delay "
           "near delayTarget x the compute time"),
    "tta": Obj({
        "values": _values(),
        "selection": _SELECTION,
        "errorFeedback": _ERROR_FEEDBACK,
        "momentumCorrection": _MOMENTUM_CORRECTION,
        "momentumMasking": _MOMENTUM_MASKING,
        "warmupSteps": _WARMUP,
        "kneeDensity": F(Float(min=0, max=1, exclusive_min=True,
                               doc="TopK's steps prior, stepLaw inverse: steps x (1 + kneeDensity/density) of the "
                                   "dense steps; 0.003 fitted on the tuning MLP (29 steps dense, 60 at 0.3%)"),
                         default=0.003),
        "stepLaw": F(Str(enum=("inverse", "power"),
                         doc="TopK's steps over the dense steps at density d: inverse, 1 + kneeDensity/d; power, "
                             "d^-densityExponent. power: adopted for the third fresh set's candidate (dev-law3, "
                             "testbed/EVALUATION.md), not yet judged as the default"),
                     default="inverse"),
        "densityExponent": F(Float(min=0, max=0.9, exclusive_min=True,
                                   doc="q of the power law (steps x d^-q); 0.109 fitted on the tuning task "
                                       "(testbed/grids/tune-families.yaml, testbed/fit_families.py)"), default=0.109),
        "minDensity": _MIN_DENSITY,
        "window": _WINDOW,
        "probeEvery": F(Int(min=2, doc="steps between bandwidth probes (a rise is found within it and 2-3 probe "
                                       "rounds: tests/test_policies.py); each probe at most 2 ordinary steps on the "
                                       "wire at the slowest rate the link held lately (issue 62)"), default=8),
        "probeGain": F(Float(min=1, exclusive_min=True, doc="a probe sends at least this x the step's own payload"),
                       default=2.0),
        "probePadding": F(Bool(doc="a probe sends the step's own selection and zeros up to its size: the training "
                                   "sees an ordinary step (unpadded, a 15% probe after 17 steps at 0.36% released "
                                   "the residual's backlog and dropped set 2's MLP from 0.86 to 0.34 accuracy); "
                                   "not yet judged as the default"), default=False),
        "adaptiveProbing": F(Bool(doc="each probe that finds nothing doubles the spacing to the next (up to 8 x "
                                      "probeEvery), a change brings it back (probes had taken 10-12% of set 4's "
                                      "CNN runs, finding nothing most of the time)"), default=True),
        "lowRanks": F(ListOf(Int(min=1, max=64), max_items=8,
                             doc="PowerSGD ranks the controller may choose instead of TopK or dense ([] for TopK "
                                 "and dense only); 1-8 as the judged set ran tta (testbed/judged/RESULTS.md) and "
                                 "the third fresh set's candidate"), default=lambda: [1, 2, 4, 8]),
        "lowRankKnee": F(Float(min=0, doc="PowerSGD's steps prior: steps x (1 + lowRankKnee/rank) of the dense "
                                          "steps; 2.3 fitted on the tuning task (testbed/grids/tune-families.yaml)"),
                         default=2.3),
        "lowRankMomentumCorrection": F(Bool(doc="with momentumCorrection, correct PowerSGD steps' momentum too; "
                                                "false: PowerSGD's as published (on set 2's step-wise link 1.35x "
                                                "PowerSGD r4's time where correcting it took 1.80x, level on the "
                                                "static one: dev-pilot-set2-probes, -shared, "
                                                "testbed/EVALUATION.md)"), default=False),
        "penalties": F(Str(max_length=4096,
                           doc="a penalties profile written by netsense calibrate: locally a file (relative to the "
                               "job file), on a cluster configmap:NAME, a ConfigMap in the job's namespace with the "
                               "key penalties.json (what a job with mode: calibrate writes, NAME <job>-penalties); "
                               "each option's steps to a loss milestone over dense fp16's, measured on this task; it "
                               "replaces the steps priors above (kneeDensity, stepLaw, densityExponent, lowRankKnee)")),
    }, checks=[_check_momentum, _check_penalties_ref], cel=[PENALTIES_CEL], removed={k: (default, f"removed from tta (issue 62: not adopted; {why}); git keeps it: commit "
                                                     f"{REMOVED_AT[:12]} is the last with it")
                                          for k, (default, why) in REMOVED_TTA.items()},
       doc="our controller: each step, the density that minimizes the predicted time to accuracy "
           "(measured step cost at the sensed bandwidth x predicted steps)"),
}, what="method", default="allreduce", aliases={"overlap": "tta", "ours": "tta"},
    doc="gradient compression: the method and its own settings (a setting of another method is an error)")
METHODS = tuple(COMPRESSION.variants)

def _cross_flow(**extra: F) -> Obj:
    return Obj({
        "flows": F(Int(min=1, max=16, doc="parallel TCP connections"), default=1),
        "start": F(Unit("duration", doc="on the training clock"), default="0s"),
        "stop": F(Unit("duration", doc="on the training clock (default: the end of the run)")),
        "congestionControl": F(Str(pattern=r"^[a-z0-9_]+$", pattern_hint="a kernel name such as cubic or bbr",
                                   doc="TCP congestion control of these flows (default: the machine's)")),
        **extra,
    })


CROSS_TRAFFIC = Union("type", {
    "bulk": _cross_flow(),
    "onoff": _cross_flow(onFor=F(Unit("duration", doc="time sending per cycle"), required=True),
                         offFor=F(Unit("duration", doc="time idle per cycle"), required=True)),
}, doc="background TCP flows from rack A to rack B of the shared topology, competing with the training traffic "
       "at the shared link (on the simulated clock: an equal share each): bulk (always on) or onoff (on/off "
       "cycles)",
   what="cross-traffic flow")


def _check_network(n: dict, path: str, errors: Errors) -> None:
    if n.get("crossTraffic") and n["topology"] != "shared":
        errors.add(_join(path, "crossTraffic"), "needs topology: shared (cross traffic competes at the shared link)")
    if n.get("simulation") and n["clock"] != "simulated":
        errors.add(_join(path, "simulation"), "sets the simulated clock's model: needs clock: simulated")
    if n["clock"] == "simulated":
        for i, entry in enumerate(n.get("crossTraffic") or []):
            if entry.get("congestionControl"):
                errors.add(_join(path, f"crossTraffic[{i}].congestionControl"),
                           "the simulated clock gives every flow at the shared link an equal share, whatever its "
                           "congestion control: leave it unset, or use clock: real")
        profile = n.get("profile") or {}
        if profile.get("loss") or profile.get("jitter"):
            errors.add(_join(path, "profile"), "the simulated clock models no loss or netem jitter (its own "
                                               "noise is simulation.jitter)")


SIMULATION_LATENCY = "0.05ms"  # a hop of a collective's ring on the simulated clock, by default

SIMULATION = Obj({
    "device": F(Str(enum=tuple(devices.PROFILES), doc="a measured accelerator's compute and compression figures "
                                                      "for this model and batch (netsense.clock.devices, each "
                                                      "with its source); computeSeconds or "
                                                      "compressionSecondsPerMelement, where given, win")),
    "computeSeconds": F(Float(min=0, exclusive_min=True,
                              doc="a step's forward and backward pass on this clock (default: measured once before "
                                  "training, the median of warm steps, and recorded in result.json)")),
    "compressionSecondsPerMelement": F(Float(min=0, doc="TopK's own work per million gradient elements it "
                                                        "compresses (error feedback, selecting, packing, decoding "
                                                        "every rank's chunk; default: measured once, the hook's "
                                                        "own code)")),
    "lowRankSecondsPerMelement": F(Float(min=0, doc="PowerSGD's own work per million gradient elements it "
                                                    "compresses (error feedback, the projections, "
                                                    "orthogonalization, applying the factors; default: measured "
                                                    "once at the job's rank, or a device profile's TopK figure)")),
    "latency": F(Unit("duration", doc="each hop of a collective's ring, besides the profile's delay"),
                 default=SIMULATION_LATENCY),
    "jitter": F(Float(min=0, max=1, doc="each collective's time scaled by 1 + jitter x N(0, 1), seeded by the job's "
                                        "seed: the same noise on every rank and every re-run"), default=0.0),
}, doc="the simulated clock's model (netsense.clock.simulated): what a step costs when nothing is slept")


NETWORK = Obj({
    "profile": F(PROFILE),
    "topology": F(Str(enum=("per-host", "shared"),
                      doc="per-host: the profile shapes each worker's own link; shared (emulated cluster, or "
                          "the simulated clock's model of it): workers on two racks joined by one link that the "
                          "profile shapes, which every ring hop crosses"), default="per-host"),
    "crossTraffic": F(ListOf(CROSS_TRAFFIC, max_items=16, doc="background flows at the shared link (topology: "
                                                             "shared)")),
    "direction": F(Str(enum=("egress", "both"), doc="per-host: shape each host's uplink, or both ways"),
                   default="egress"),
    "interface": F(Str(doc="interface the sidecar shapes"), default="eth0"),
    "clock": F(Str(enum=("real", "simulated"),
                   doc="real: the emulated (or a cluster's) link; simulated (netsense run only): the same training "
                       "over loopback, each step's time from a model (spec.network.simulation), deterministic"),
               default="real"),
    "simulation": F(SIMULATION),
}, checks=[_check_network], cel=[
    {"rule": "!has(self.crossTraffic) || size(self.crossTraffic) == 0 || self.topology == 'shared'",
     "message": "crossTraffic needs topology: shared"}])

RUN_POLICY = Obj({
    "backoffLimit": F(Int(min=0), default=2),
    "maxDisruptions": F(Int(min=0, doc="cluster: gang restarts after disruptions (an eviction by the Eviction API "
                                       "or a drain, preemption, a lost node) before the job fails "
                                       "(DisruptionLimitExceeded); not counted against backoffLimit, an event each"),
                        default=10),
    "activeDeadlineSeconds": F(Int(min=1, doc="fail the job this long after it started (or was resumed)")),
    "lostNodeSeconds": F(Int(min=1, doc="cluster: a rank whose node has not been Ready this long is lost: the "
                                        "gang restarts as a disruption, and pods on that node are deleted at "
                                        "once (no kubelet is left to end them)"), default=60),
    "pendingTimeoutSeconds": F(Int(min=1, doc="cluster: fail the job when its gang is not all running this long "
                                              "after the job became Pending (created, restarted or resumed: a "
                                              "wait for quota, scheduling and image pulls all count); what it "
                                              "waits for is in the PodsReady condition meanwhile")),
    "ttlSecondsAfterFinished": F(Int(min=0)),
    "keepFailedPods": F(Bool(doc="cluster: keep a Failed job's last pods (and their logs) for inspection until "
                                 "the job is deleted; by default they are deleted at once, freeing their nodes"),
                        default=False),
})

# A relative directory that stays inside the volume: no segment is "." or ".." (RE2 has no lookahead, so the
# apiserver's copy of the pattern spells that out: a segment starts with a non-dot, or one dot and a non-dot, or
# two dots and more).
_SEGMENT = r"(?:[A-Za-z0-9_-][A-Za-z0-9._-]*|\.[A-Za-z0-9_-][A-Za-z0-9._-]*|\.\.[A-Za-z0-9._-]+)"
OUTPUT_PATH = rf"^{_SEGMENT}(?:/{_SEGMENT})*$"

OUTPUT = Obj({
    "claimName": F(Str(pattern=DNS_SUBDOMAIN, max_length=253,
                       pattern_hint="a PersistentVolumeClaim's name: lower-case letters, digits, '-' and '.'",
                       doc="a PersistentVolumeClaim in the job's namespace (ReadWriteMany where ranks run on several "
                           "nodes)"), required=True),
    "path": F(Str(pattern=OUTPUT_PATH, max_length=512,
                  pattern_hint="a relative directory inside the volume: names of letters, digits, '.', '_' and '-' "
                               "joined by '/', none of them '.' or '..'",
                  doc="a directory on the volume (default: its root)")),
}, doc="cluster: the volume every rank writes its artifacts to, under <path>/<job>/attempt-<n>/rank-<r>/: rank 0 "
       "its timeline.csv and result.json, every shaped rank its link's queue samples (queue.csv); netsense run "
       "keeps its own output directory and ignores this")


def _check_procs(spec: dict, path: str, errors: Errors) -> None:
    """Several processes a worker take a GPU each: a GPU limit below their number cannot hold them."""
    procs = spec.get("procsPerWorker") or 1
    gpus = ((spec.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu")
    if procs > 1 and gpus is not None and str(gpus).isdigit() and int(gpus) < procs:
        errors.add(_join(path, "resources.limits.nvidia.com/gpu"),
                   f"{gpus} GPU(s) for procsPerWorker: {procs} (one GPU a process where they run on CUDA)")


MODES = ("train", "calibrate")
CALIBRATION = Obj({
    "seeds": F(Int(min=1, max=8, doc="seeds per option, from training.seed on"), default=2),
    "steps": F(Int(min=10, max=100000, doc="rung 0's step budget per run; rung r's is steps x 2^r"), default=200),
    "rungs": F(Int(min=1, max=6, doc="successive-halving rungs"), default=3),
    "densities": F(ListOf(Float(min=0, max=1, exclusive_min=True), min_items=1, max_items=6,
                          doc="TopK's densities"), default=lambda: [0.01, 0.003, 0.001]),
    "ranks": F(ListOf(Int(min=1, max=64), min_items=1, max_items=6, doc="PowerSGD's ranks"),
               default=lambda: [2, 8]),
    "parallel": F(Int(min=1, max=16, doc="runs at once (a simulated run takes a core a worker: size "
                                         "spec.resources to match on a cluster)"), default=2),
}, doc="how mode: calibrate (and netsense calibrate, whose flags override it) races the options: dense fp16, TopK "
       "at densities, PowerSGD at ranks, each to the same loss milestone on the simulated clock")

SPEC = Obj({
    "mode": F(Str(enum=MODES, doc="train (the default): the training run; calibrate: race the compression options "
                                  "on this job's model, data, batch and lr (netsense calibrate; on a cluster one pod, "
                                  "its profile into the ConfigMap <job>-penalties for tta's compression.penalties)")),
    "calibration": F(CALIBRATION),
    "workers": F(Int(min=1, max=512, doc="worker pods (emulated hosts), each behind its own shaped link"), default=2),
    "procsPerWorker": F(Int(min=1, max=16, doc="training processes in each worker, torchrun-style: rank = worker x "
                                               "procsPerWorker + LOCAL_RANK, one GPU each (cuda:LOCAL_RANK); the "
                                               "profile shapes the traffic between workers, not between one "
                                               "worker's own processes, which stays inside it"), default=1),
    "suspend": F(Bool(doc="cluster: true creates no pods (and deletes a running gang: phase Suspended), so a "
                          "queue such as Kueue can admit the whole job at once; false again starts a new gang. The "
                          "one field a started job may change"), default=False),
    "image": F(Str(doc="the trainer's image; default: the one the operator was installed with "
                      "(NETSENSE_WORKER_IMAGE: the local overlay's built image, the gpu overlay's registry)")),
    "imagePullPolicy": F(Str(enum=("Always", "IfNotPresent", "Never")), default="IfNotPresent"),
    "resources": F(podtemplate.RESOURCES),
    "podTemplate": F(podtemplate.POD_TEMPLATE),
    "training": F(TRAINING, default=dict),
    "compression": F(COMPRESSION, default=dict),
    "network": F(NETWORK, default=dict),
    "runPolicy": F(RUN_POLICY, default=dict),
    "output": F(OUTPUT),
}, checks=[podtemplate.check_shaped, _check_procs, _check_lowrank_momentum, _check_null_wire, _check_simulated], cel=podtemplate.SHAPED_CEL)

METADATA = Obj({
    "name": F(Str(pattern=DNS_LABEL, max_length=50,
                  pattern_hint="lower-case letters, digits and '-', starting and ending alphanumeric"),
              required=True),
    "namespace": F(Str()),
    # Fields the API server adds; accepted and ignored so `kubectl get -o yaml` output validates.
    **{k: F(Free()) for k in ("labels", "annotations")},
    **{k: F(Str()) for k in ("uid", "resourceVersion", "creationTimestamp")},
    "generation": F(Int()),
    "managedFields": F(ListOf()),
    "finalizers": F(ListOf(Str())),
})


class SpecError(BadInput, ValueError):
    """Every problem found in a job, each with its field path."""

    def __init__(self, issues: list[Issue]):
        self.issues = list(issues)
        super().__init__("\n".join(str(i) for i in self.issues))  # one per line


@dataclass(frozen=True)
class Job:
    name: str
    spec: dict  # normalized, defaults filled, camelCase as in YAML

    @property
    def workers(self) -> int:
        """Worker pods (hosts)."""
        return self.spec["workers"]

    @property
    def procs_per_worker(self) -> int:
        return self.spec.get("procsPerWorker") or 1

    @property
    def mode(self) -> str:
        """train, or calibrate (race the compression options: netsense calibrate, or one pod on a cluster)."""
        return self.spec.get("mode") or "train"

    @property
    def pods(self) -> int:
        """The pods of one attempt on a cluster: a worker each, or the calibration's one."""
        return 1 if self.mode == "calibrate" else self.workers

    @property
    def world(self) -> int:
        """Training processes (ranks) in all."""
        return self.workers * self.procs_per_worker

    @property
    def training(self) -> dict:
        return self.spec["training"]

    @property
    def compression(self) -> dict:
        return self.spec["compression"]

    @property
    def network(self) -> dict:
        return self.spec["network"]

    @property
    def run_policy(self) -> dict:
        return self.spec["runPolicy"]

    def manifest(self) -> dict:
        return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": self.name}, "spec": self.spec}


# What the first CRD filled into every job's spec.compression (then one flat bag of every method's settings):
# a job stored before the union, or the appliedSpec an earlier operator recorded, still carries them.
_FLAT_DEFAULTS = {"density": 0.1, "errorFeedback": True, "warmupSteps": 0, "rank": 1, "startIter": 10,
                  "alpha": 0.5, "beta": 0.01, "bdpFraction": 0.9, "initialRatio": 0.01, "minRatio": 0.001,
                  "maxRatio": 1.0, "startup": True, "window": 10, "quantize": True, "trq": 0.1, "trd": 1e-3,
                  "pruneFactor": 0.5, "kneeDensity": 0.003, "minDensity": 0.001, "probeEvery": 8, "probeGain": 2.0}


def _without_flat_defaults(spec: Any) -> Any:
    """Other methods' settings that hold exactly the first CRD's defaults are the API server's, not the
    user's: dropped. Any other value of another method's setting is still an error."""
    c = spec.get("compression") if isinstance(spec, dict) else None
    if not isinstance(c, dict):
        return spec
    method = c.get("method", COMPRESSION.default)
    variant = COMPRESSION.variants.get(COMPRESSION.aliases.get(method, method))
    if variant is None:
        return spec
    kept = {k: v for k, v in c.items()
            if k == "method" or k in variant.fields or k not in _FLAT_DEFAULTS or _FLAT_DEFAULTS[k] != v}
    return {**spec, "compression": kept}


def parse_spec(spec: Any, name: str = "job") -> Job:
    """Validate a bare ``spec`` mapping (what the operator receives from the API server, which may hold
    what an earlier CRD defaulted)."""
    spec = _without_flat_defaults(spec)
    errors = Errors()
    parsed = SPEC.parse(spec, "spec", errors)
    if errors:
        raise SpecError(errors)
    return Job(name=name, spec=parsed)


def parse_job(doc: Any) -> Job:
    """Validate a whole NetSenseJob document; raises SpecError listing every problem."""
    errors = Errors()
    if not isinstance(doc, dict):
        raise SpecError([Issue("(top)", f"a NetSenseJob is a YAML mapping (got {type(doc).__name__})")])
    if doc.get("apiVersion") != API_VERSION:
        errors.add("apiVersion", f"must be {API_VERSION} (got {doc.get('apiVersion')!r})")
    if doc.get("kind") != KIND:
        errors.add("kind", f"must be {KIND} (got {doc.get('kind')!r})")
    for key in doc:
        if key not in ("apiVersion", "kind", "metadata", "spec", "status"):
            errors.add(key, "unknown top-level field")
    meta = METADATA.parse(doc.get("metadata", MISSING) if "metadata" in doc else {}, "metadata", errors)
    if "spec" not in doc:
        errors.add("spec", "required field is missing")
    spec = SPEC.parse(doc.get("spec"), "spec", errors)
    if errors:
        raise SpecError(errors)
    return Job(name=meta["name"], spec=spec)


def read_yaml(path: str, what: str = "file", field: str | None = None) -> Any:
    """Load one YAML document; unreadable or invalid files raise SpecError naming the place."""
    where_field = field or path
    try:
        with open(path) as fh:
            return yaml.safe_load(fh)
    except OSError as e:
        raise SpecError([Issue(where_field, f"cannot read the {what} {path}: {e.strerror}")]) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise SpecError([Issue(where_field, f"not valid YAML{where}: {getattr(e, 'problem', e)}")]) from None


def inline_trace_file(profile: dict | None, relative_to: str, field_path: str) -> bool:
    """Replace a trace profile's ``file`` (relative to the file at ``relative_to``) by its
    ``points``, so the profile can travel to a pod. Returns whether it did."""
    if not profile or profile["type"] != "trace" or "file" not in profile:
        return False
    base = os.path.dirname(os.path.abspath(relative_to))
    profile["points"] = read_trace(os.path.join(base, profile.pop("file")), field_path)
    return True


def load_job(path: str) -> Job:
    """Read and validate a job file; trace files are resolved relative to it and inlined, a penalties profile
    resolved relative to it and read (its path made absolute, so that every worker reads the same file)."""
    job = parse_job(read_yaml(path, "job file"))
    if inline_trace_file(job.network.get("profile"), path, "spec.network.profile.file"):
        job = parse_job(job.manifest())  # re-validate the inlined points
    if job.compression.get("penalties") and penalties_configmap(job.compression) is None:
        base = os.path.dirname(os.path.abspath(path))
        job.compression["penalties"] = os.path.join(base, job.compression["penalties"])
        check_penalties(job.compression["penalties"], "spec.compression.penalties")
    return job


def check_penalties(path: str, field_path: str) -> None:
    """A penalties file that cannot be read or holds no profile is the job's error, naming its field."""
    from netsense.control import penalties

    try:
        penalties.load(path)
    except penalties.PenaltiesError as e:
        raise SpecError([Issue(field_path, str(e))]) from None


def read_trace(path: str, field_path: str) -> list[dict]:
    """A recorded trace: CSV with columns t,rate (t in seconds or '30s') or a YAML list."""
    if not os.path.exists(path):
        raise SpecError([Issue(field_path, f"trace file {path} does not exist")])
    if path.endswith((".yaml", ".yml")):
        points = read_yaml(path, "trace", field_path)
        if not isinstance(points, list):
            raise SpecError([Issue(field_path, f"{path}: a YAML trace is a list of {{at, rate}}")])
        return points
    with open(path) as fh:
        rows = [r for r in csv.reader(fh) if r and not r[0].startswith("#")]
    if rows and not units.is_bare_number(rows[0][0].rstrip("smh")):
        rows = rows[1:]  # header
    try:
        # A CSV trace's t is in seconds (its documented column): written with the unit a job's durations need.
        return [{"at": f"{float(r[0]):g}s" if units.is_bare_number(r[0]) else r[0].strip(), "rate": r[1].strip()} for r in rows]
    except IndexError:
        raise SpecError([Issue(field_path, f"{path}: each CSV row needs t,rate")]) from None




def check_local(job: Job) -> None:
    """Checks for local runs: what depends on this machine's files, and what only a cluster does."""
    if job.spec["suspend"]:
        raise SpecError([Issue("spec.suspend", "a local run cannot be suspended (it is for a cluster's queue); "
                                               "set it false or leave it out")])
    if job.mode == "calibrate":
        raise SpecError([Issue("spec.mode", "calibrate: netsense calibrate JOB races the options locally (netsense run "
                                            "trains); on a cluster the operator runs it")])
    if (name := penalties_configmap(job.compression)) is not None:
        raise SpecError([Issue("spec.compression.penalties", f"configmap:{name} names a cluster's ConfigMap; locally "
                                                             "give the file netsense calibrate wrote (penalties.json, "
                                                             "relative to the job file)")])
    t = job.training
    if t["dataset"] in ("cifar10", "cifar100") and not os.path.isdir(t["dataPath"]):
        raise SpecError([Issue("spec.training.dataPath",
                               f"{t['dataPath']} does not exist (datasets are never downloaded at run time)")])


def check_cluster(job: Job) -> None:
    """What only the emulated cluster can do: refused on a cluster, where the network between nodes is real. A
    calibrate job's network and penalties are not used (its runs are simulated, with their own link)."""
    if job.mode == "calibrate":
        return
    net, issues = job.network, []
    profile = net.get("profile")
    if profile and profile["type"] == "trace" and "file" in profile:
        issues.append(Issue("spec.network.profile.file", "trace files cannot be read in a cluster; inline them as "
                                                         "points"))
    if net["topology"] == "shared":
        issues.append(Issue("spec.network.topology", "shared is the emulated cluster's switch; on a cluster "
                                                     "the nodes' own network is the shared link (use per-host)"))
    if job.compression.get("penalties") and penalties_configmap(job.compression) is None:
        issues.append(Issue("spec.compression.penalties", "a penalties file is read locally (netsense run, "
                                                          "netsense bench); a cluster's pods cannot read it: name a "
                                                          "ConfigMap, configmap:NAME (a calibrate job writes "
                                                          "<job>-penalties; or kubectl create configmap NAME "
                                                          "--from-file=penalties.json)"))
    if net["clock"] == "simulated":
        issues.append(Issue("spec.network.clock", "simulated is a study tool of netsense run and netsense bench; "
                                                  "a cluster's job runs on its real network (use real)"))
    if issues:
        raise SpecError(issues)


def warnings_for(job: Job) -> list[str]:
    """What is valid but cannot be meant: a profile whose changes come after the job's training budget
    (training.maxSeconds) can end."""
    from netsense.shaping.profiles import build_profile, unseen_changes, unseen_message

    budget = job.training.get("maxSeconds")
    if budget is None or not job.network.get("profile"):
        return []
    seconds = units.parse_duration(budget)
    changes = unseen_changes(build_profile(job.network["profile"]), seconds)
    return [unseen_message(changes, seconds, "this job's training budget (training.maxSeconds)")] if changes else []
