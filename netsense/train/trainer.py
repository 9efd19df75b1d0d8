"""The DDP trainer: what runs in every worker (a host of the emulated cluster or a Kubernetes pod).

Configuration comes from the environment, exactly as a pod gets it:
MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK (torch's env:// rendezvous),
NETSENSE_JOB_FILE (the NetSenseJob as a JSON file: a trace profile can be far
larger than the 128 KiB one environment variable may hold), NETSENSE_PROFILE_START_FILE (where this
rank publishes its training clock for its shaper: the profile runs on the clock
that time to accuracy is measured on, see netsense.shaping.shaper), NETSENSE_OUT
(directory for result.json and timeline.csv, rank 0; on a cluster with spec.output, each rank's own directory
on the job's volume), NETSENSE_QUEUE_CSV (this pod's shaper's queue samples, copied there at the end),
NETSENSE_OUTPUT_URI (where the attempt's artifacts are: the result's "artifacts"), NETSENSE_RESULT_PATH (the
compact result, e.g. the pod's termination message), NETSENSE_QUEUE_SUMMARY
(where this pod's shaper keeps its queue's summary: rank 0's result carries it) and
NETSENSE_TIMEOUT (collective timeout in seconds: a dead peer ends the run, never
a hang).

Rank 0 prints JSON lines on stdout: progress, evaluations, and the result.
Stop decisions (target reached, wall budget) are taken by rank 0 and shared by
a one-element all_reduce at "sync points" every few steps, so every rank leaves
the loop at the same step.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import signal
import socket
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from netsense import gang, units
from netsense.clock import REAL, RealClock, devices
from netsense.clock.simulated import SimulatedClock
from netsense.compression import ddp_options, register
from netsense.emulation.cross import flows_from_spec
from netsense.errors import Terminated
from netsense.shaping.profiles import build_profile, unseen_changes, unseen_message
from netsense.shaping.queue import read_summary
from netsense.shaping.shaper import write_clock
from netsense.spec import Job, SpecError, parse_spec
from netsense.spec.job import SIMULATION_LATENCY
from netsense.spec.schema import Issue
from netsense.train import calibrate
from netsense.train.data import ShardedBatches, load_dataset
from netsense.train.models import build_model, cross_entropy
from netsense.train.reading import Reading
from netsense.train.results import Timeline, compact, job_target, reaches, write_result

SYNC_EVERY = 10  # steps between stop-flag agreements
PROGRESS_EVERY_S = 1.0


def emit(event: str, **fields) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def wait_for_master(addr: str, port: int, timeout_s: float) -> None:
    """Non-zero ranks wait (bounded) until rank 0's rendezvous port answers."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((addr, port), timeout=2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"rank 0 at {addr}:{port} not reachable after {timeout_s:.0f}s") from None
            time.sleep(0.2)


@dataclass
class RunState:
    step: int = 0
    epoch: int = 0
    train_time: float = 0.0  # excludes evaluation
    best_accuracy: float | None = None
    final_accuracy: float | None = None
    best_eval_loss: float | None = None
    final_eval_loss: float | None = None
    tta: float | None = None  # the time to the job's target, accuracy or loss
    # the current run of evaluations that met the target: its first (step, time), and its length
    held_since: tuple[int, float] | None = None
    held: int = 0
    last_loss: float = float("nan")
    eval_seconds: float = 0.0  # off the training clock: evaluation and the stop agreement
    accuracies: list[tuple[int, float, float]] = field(default_factory=list)  # step, time, acc
    eval_losses: list[tuple[int, float, float]] = field(default_factory=list)  # step, time, mean loss


class Evaluation(NamedTuple):
    accuracy: float  # the share of predictions right: of samples, or of a sequence model's next tokens
    loss: float  # the mean cross-entropy of the same predictions


def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device,
             batch: int = 500) -> Evaluation:
    """The model's accuracy and mean loss on (x, y): per sample for a classifier, per position for a sequence
    model (logits (N, T, V) against targets (N, T))."""
    model.eval()
    correct, total = 0, 0.0
    with torch.no_grad():
        for i in range(0, len(y), batch):
            out, target = model(x[i:i + batch].to(device)), y[i:i + batch].to(device)
            correct += int((out.argmax(-1) == target).sum())
            total += float(cross_entropy(out, target, reduction="sum"))
    model.train()
    predictions = max(1, y.numel())
    return Evaluation(correct / predictions, total / predictions)


def resolve_device(training: dict, cuda: bool) -> tuple[str, torch.device]:
    """(backend, device) of spec.training's backend and device on a machine with or without CUDA."""
    backend, device = training["backend"], training["device"]
    for field_, wants in (("device", device == "cuda"), ("backend", backend == "nccl")):
        if wants and not cuda:
            raise SpecError([Issue(f"spec.training.{field_}", f"{training[field_]} needs a CUDA device and torch "
                                   "sees none here (torch.cuda.is_available() is false)")])
    if backend == "auto":
        backend = "nccl" if cuda and device != "cpu" else "gloo"
    on_gpu = device == "cuda" or (device == "auto" and backend == "nccl")
    return backend, torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}") if on_gpu else torch.device("cpu")


class Trainer:
    def __init__(self, job: Job, rank: int, world: int, start_file: str | None = None):
        self.job, self.rank, self.world = job, rank, world
        self.t = job.training
        torch.set_num_threads(self.t["threads"])
        self.backend, self.device = resolve_device(self.t, torch.cuda.is_available())
        self.budget_s = units.parse_duration(self.t["maxSeconds"]) if self.t.get("maxSeconds") else None
        self.profile = build_profile(job.network.get("profile"))
        self.start_file = start_file
        self.profile_epoch: float | None = None  # set when training starts
        self.timeline = Timeline()
        self.state = RunState()
        self.clock: RealClock | SimulatedClock = REAL
        self.simulation: dict | None = None  # the simulated clock's inputs, as result.json records them
        self.reading: Reading | None = None  # spec.training.readingSteps' instrument, made in setup
        self.data_source: dict | None = None  # what a dataset made from local files was made of (pysource's text)
        if job.network["clock"] == "simulated":
            # Deterministic kernels (and one thread, which validation holds it to): the same job and seed give
            # the same run, bit for bit.
            torch.use_deterministic_algorithms(True, warn_only=True)

    def link_rate_mbit(self) -> float | None:
        if self.profile is None or self.profile_epoch is None:
            return None
        return self.profile.rate_at(self.state.train_time) / 1e6

    def setup(self) -> None:
        timeout = float(os.environ.get("NETSENSE_TIMEOUT", "120"))
        if self.rank != 0:
            wait_for_master(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), max(timeout, 300))
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        dist.init_process_group(self.backend, rank=self.rank, world_size=self.world,
                                timeout=datetime.timedelta(seconds=timeout))
        self.data = load_dataset(self.t)
        self.data_source = self.data.source
        torch.manual_seed(self.t["seed"])  # identical initial weights (DDP also broadcasts them)
        model = build_model(self.t["model"], self.data.input_shape, self.data.classes, self.t["hiddenSize"])
        model.to(self.device)
        if self.job.network["clock"] == "simulated":
            self.clock = self._simulated_clock(model)
        self.model = DDP(model, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                         gradient_as_bucket_view=True, **ddp_options(self.job.compression, self.backend))
        sgd = self.t["optimizer"] == "sgd"  # momentum correction is SGD's: Adam keeps its own terms
        self.reading = Reading(self.t["readingSteps"], seed=self.t["seed"] + 1000 * self.rank) \
            if self.t["readingSteps"] else None
        self.hook = register(self.model, self.job.compression, seed=self.t["seed"],
                             momentum=self.t["momentum"] if sgd else 0.0,
                             weight_decay=self.t["weightDecay"] if sgd else 0.0, null_wire=self.t["nullWire"],
                             clock=self.clock, reading=self.reading)
        if self.clock.simulated and self._reads_clock():
            self.clock.shapes = None  # its steps follow the link: not replayable, not kept (netsense.clock.replay)
        if not sgd:
            self.opt = torch.optim.Adam(self.model.parameters(), lr=self.t["lr"], weight_decay=self.t["weightDecay"])
        else:
            momentum, weight_decay = self.hook.optimizer_terms(self.t["momentum"], self.t["weightDecay"])
            self.opt = torch.optim.SGD(self.model.parameters(), lr=self.t["lr"], momentum=momentum,
                                       weight_decay=weight_decay)
        self.batches = ShardedBatches(self.data, self.t["batchSize"], self.rank, self.world, self.t["seed"])
        if len(self.batches) == 0:
            raise ValueError(f"spec.training.batchSize: {self.t['batchSize']} x {self.world} workers is more "
                             f"than the {len(self.data.train_y)} training samples")
        n_eval = min(self.t["evalSamples"], len(self.data.test_y))
        self.eval_x, self.eval_y = self.data.test_x[:n_eval], self.data.test_y[:n_eval]

    def _simulated_clock(self, model: torch.nn.Module) -> SimulatedClock:
        """The modeled clock, its measured inputs measured once on rank 0 and broadcast (calibrate.py)."""
        sim = self.job.network.get("simulation") or {}
        given = list(devices.given_inputs(sim))
        measured = torch.tensor([-1.0 if v is None else float(v) for v in given], dtype=torch.float64)
        if self.rank == 0 and None in given:
            batch = self.t["batchSize"]
            found = calibrate.inputs(model, self.data.train_x[:batch].to(self.device),
                                     self.data.train_y[:batch].to(self.device), self.t, self.job.compression,
                                     self.world, compute=given[0])
            measured = torch.tensor([found[i] if v is None else float(v) for i, v in enumerate(given)],
                                    dtype=torch.float64)
        if self.world > 1:
            dist.broadcast(measured, 0)
        compute, per_melement, lowrank = (float(v) for v in measured)
        latency = sim.get("latency", SIMULATION_LATENCY)
        self.simulation = {**dict(zip(devices.INPUTS, (compute, per_melement, lowrank), strict=True)),
                           "device": sim.get("device"), "latency": latency, "jitter": sim.get("jitter", 0.0),
                           "measured": [k for k, v in zip(devices.INPUTS, given, strict=True) if v is None]}
        net = self.job.network
        return SimulatedClock(self.profile, self.world, compute, per_melement, units.parse_duration(latency),
                              sim.get("jitter", 0.0), self.t["seed"], lowrank_s_per_melement=lowrank,
                              topology=net["topology"], cross=flows_from_spec(net.get("crossTraffic") or []),
                              procs_per_worker=self.job.procs_per_worker)

    # -- stopping ----------------------------------------------------------------------
    def _max_steps(self) -> int:
        limits = []
        if "epochs" in self.t:
            limits.append(self.t["epochs"] * len(self.batches))
        if "maxSteps" in self.t:
            limits.append(self.t["maxSteps"])
        return min(limits) if limits else 10**12

    def _min_epochs_done(self) -> bool:
        return self.state.step >= math.ceil(self.t.get("minEpochs", 0) * len(self.batches))

    def _eval_due(self, step: int, end_of_epoch: bool) -> bool:
        every = self.t.get("evalEvery")
        return (step % every == 0) if every else end_of_epoch

    def _local_stop(self) -> bool:
        if self.t["stopAtTarget"] and self.state.tta is not None and self._min_epochs_done():
            return True
        return self.budget_s is not None and self.state.train_time >= self.budget_s

    def _agree_stop(self) -> bool:
        flag = torch.tensor([1.0 if (self.rank == 0 and self._local_stop()) else 0.0], device=self.device)
        dist.all_reduce(flag)
        return flag.item() > 0

    def _evaluate(self) -> None:
        if self.rank != 0:
            return
        ev = evaluate(self.model.module, self.eval_x, self.eval_y, self.device)
        s = self.state
        s.final_accuracy, s.final_eval_loss = ev.accuracy, ev.loss
        s.best_accuracy = ev.accuracy if s.best_accuracy is None else max(s.best_accuracy, ev.accuracy)
        s.best_eval_loss = ev.loss if s.best_eval_loss is None else min(s.best_eval_loss, ev.loss)
        s.accuracies.append((s.step, s.train_time, ev.accuracy))
        s.eval_losses.append((s.step, s.train_time, ev.loss))
        self._hold_target(ev)
        if self.timeline.rows:
            self.timeline.rows[-1]["accuracy"] = ev.accuracy
        emit("eval", step=s.step, epoch=s.epoch, accuracy=ev.accuracy, loss=round(ev.loss, 5),
             time=round(s.train_time, 3), time_to_accuracy_s=s.tta)

    def _hold_target(self, ev: Evaluation) -> None:
        """Count this evaluation into the target's hold: the target is reached once targetHold evaluations in a
        row meet it (an accuracy at or above targetAccuracy, a loss at or below targetLoss), at the first of
        them; one that misses starts the count again."""
        s, target = self.state, job_target(self.t)
        if target is None or s.tta is not None:
            return
        metric, value = target
        if reaches(metric, ev.accuracy if metric == "accuracy" else ev.loss, value):
            s.held_since = s.held_since or (s.step, s.train_time)
            s.held += 1
            if s.held >= self.t["targetHold"]:
                s.tta = s.held_since[1]
        else:
            s.held_since, s.held = None, 0

    def start_profile_clock(self) -> None:
        """Agree on when training starts (rank 0's clock) and start the profile there.

        Every rank writes the time to its shaper's start file; until then the
        shapers hold the profile's first step (see netsense.shaping.shaper).
        Locally the clock is published even without a profile: the queue
        sampler and the cross traffic run on it too. Every rank takes part in
        the broadcast whatever it has to publish: only rank 0 has the start file
        of an unshaped local run, and a broadcast only it entered hung the run.
        On the simulated clock the profile runs on that clock (no shaper): its epoch is the clock's 0."""
        if self.clock.simulated:
            self.profile_epoch = self.clock.wall()
            if self.rank == 0:
                emit("clock", profile_epoch=self.profile_epoch, simulated=True)
            return
        now = torch.tensor([time.time()], dtype=torch.float64, device=self.device)
        if self.world > 1:
            dist.broadcast(now, 0)
        self.profile_epoch = float(now.item())
        if self.start_file:
            write_clock(self.start_file, self.profile_epoch)
        if self.rank == 0:
            emit("clock", profile_epoch=self.profile_epoch)

    def _stop_clock(self) -> None:
        """Evaluation and the stop agreement are off the training clock: the profile stands still too."""
        if self.start_file and self.profile_epoch is not None:
            write_clock(self.start_file, self.profile_epoch, paused_at=self.state.train_time)

    def _restart_clock(self) -> None:
        if self.profile_epoch is not None and not self.clock.simulated:
            self.profile_epoch = time.time() - self.state.train_time
            if self.start_file:
                write_clock(self.start_file, self.profile_epoch)

    # -- the loop ----------------------------------------------------------------------
    def train(self) -> dict:
        s = self.state
        self.start_profile_clock()
        max_steps = self._max_steps()
        samples_per_step = self.t["batchSize"] * self.world
        start, real_start = self.clock.now(), time.perf_counter()
        last_progress = 0.0
        stop = False
        while not stop and s.step < max_steps:
            batches = list(self.batches.epoch(s.epoch))
            for i, (x, y) in enumerate(batches):
                t0 = self.clock.now()
                self.hook.start_step()  # the step's compute starts at the forward pass
                x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
                loss = cross_entropy(self.model(x), y)
                self.opt.zero_grad(set_to_none=False)
                loss.backward()
                self.opt.step()
                rec = self.hook.end_step() or {}
                s.step += 1
                s.last_loss = float(loss.detach())
                if self.reading is not None:
                    self.reading.end_step(s.step, s.last_loss)
                step_time = self.clock.now() - t0
                s.train_time = self.clock.now() - start - s.eval_seconds
                self.timeline.add(
                    time=round(s.train_time, 4), step=s.step, epoch=s.epoch, loss=round(s.last_loss, 5),
                    density=rec.get("density"), lowrank_rank=rec.get("lowrank_rank") or None, bytes=rec.get("wire_bytes"), comm_s=rec.get("comm_seconds"),
                    compute_s=rec.get("compute_seconds"), selection_s=rec.get("selection_seconds"),
                    est_btlbw_mbit=_mbit(rec.get("est_btlbw_bytes_per_s")), est_rtprop_ms=_ms(rec.get("est_rtprop_s")),
                    link_rate_mbit=self.link_rate_mbit(),
                    samples_per_s=round(samples_per_step / step_time, 2), dense_reason=rec.get("dense_reason"),
                    probe=int(bool(rec.get("probe"))), accuracy=None)
                end_of_epoch = i == len(batches) - 1
                eval_due = self._eval_due(s.step, end_of_epoch) or s.step == max_steps
                sync_due = s.step < max_steps and (s.step % SYNC_EVERY == 0 or eval_due)
                if eval_due or sync_due:
                    # Evaluating and agreeing to stop are measuring, not training: off the training clock.
                    t_off = self.clock.now()
                    self._stop_clock()
                    if eval_due:
                        self._evaluate()
                    if sync_due:
                        stop = self._agree_stop()
                    s.eval_seconds += self.clock.now() - t_off
                    self._restart_clock()
                if self.rank == 0 and time.perf_counter() - last_progress >= PROGRESS_EVERY_S:
                    last_progress = time.perf_counter()
                    self._progress(max_steps, samples_per_step)
                if stop or s.step >= max_steps:
                    break
            s.epoch += 1
        self.hook.finish()
        self._stop_clock()  # training is over: the profile, the cross traffic and the queue's summary stop here
        if s.final_accuracy is None or s.accuracies[-1][0] != s.step:
            self._evaluate()
        # wall_seconds is real time on either clock: on the simulated one, what the study cost to run
        return self._result(samples_per_step, time.perf_counter() - real_start)

    def _reads_clock(self) -> bool:
        """Whether the compression decides by the steps' measured times (a controller: tta, the paper's, dc2)."""
        policy = getattr(self.hook, "policy", None)
        return policy is not None and policy.measures

    def interrupted_result(self) -> dict | None:
        """What the run reached before it was stopped (status Interrupted); None before training began."""
        if getattr(self, "hook", None) is None or not self.hook.history:
            return None
        result = self._result(self.t["batchSize"] * self.world, 0.0)
        result.update(status="Interrupted", wall_seconds=None)
        return result

    def _progress(self, max_steps: int, samples_per_step: int) -> None:
        s = self.state
        recent = self.timeline.rows[-20:]
        dt = recent[-1]["time"] - recent[0]["time"] if len(recent) > 1 else 0
        sps = samples_per_step * (len(recent) - 1) / dt if dt > 0 else 0.0
        last = self.timeline.rows[-1]
        emit("progress", step=s.step, max_steps=max_steps if max_steps < 10**12 else None, epoch=s.epoch,
             loss=round(s.last_loss, 4), samples_per_s=round(sps, 1), density=last["density"],
             rate_mbit=last["link_rate_mbit"], accuracy=s.final_accuracy, time=round(s.train_time, 2),
             profile_epoch=self.profile_epoch)

    def _value_encoding(self) -> str:
        """How the method's values travel: fp32 or fp16 (``values``), or the paper's gate (fp16 when the ratio is
        below trq)."""
        c = self.job.compression
        if "values" in c:
            return c["values"]
        if c["method"] == "netsense":
            return "fp16 below trq, else fp32" if c["quantize"] else "fp32"
        return "fp16" if c["method"] == "fp16" else "fp32"

    def _penalties_record(self) -> dict | None:
        """The penalties profile tta's controller priced its options with, as it read it (None: the priors)."""
        loaded = getattr(getattr(self.hook, "policy", None), "penalties", None)
        if loaded is None:
            return None
        return {"file": loaded.source, "cost": loaded.cost,
                "topk": {f"{d:g}": f for d, f in sorted(loaded.topk.items())},
                "powersgd": {str(r): f for r, f in sorted(loaded.powersgd.items())}}

    def _result(self, samples_per_step: int, wall: float) -> dict:
        s = self.state
        target = job_target(self.t)
        hist = self.hook.history
        wire = sum(h["wire_bytes"] for h in hist)
        comm = sum(h["comm_seconds"] for h in hist)
        compressed = [h for h in hist if not h["warmup"]] or hist  # the dense warm-up is reported apart
        link = None
        if self.profile is not None and self.profile_epoch is not None:
            link = self.profile.mean_rate(0.0, s.train_time) / 1e6
        rates = sorted(r["link_rate_mbit"] for r in self.timeline.rows if r.get("link_rate_mbit") is not None)
        # TopK's sparse steps: the bytes each element sent cost on the wire (value + index, per peer), so that
        # methods are compared at the same encoding
        topk = [h for h in hist if not h["dense"] and not h.get("lowrank_rank") and h["elements_sent"]]
        sent = sum(h["elements_sent"] for h in topk) * (self.world - 1)
        return {
            "job": self.job.name,
            "method": self.job.compression["method"],
            "workers": self.world,
            "seed": self.t["seed"],
            "max_seconds": self.budget_s,  # the training budget in seconds (None: none), which stops by the clock
            "model": self.t["model"],
            "dataset": self.t["dataset"],
            # pysource: the text trained on (sha256, bytes, files, Python version): it differs between Pythons
            "text": self.data_source,
            "status": "Succeeded",
            "throughput_samples_per_s": round(self.timeline.steady_throughput(samples_per_step), 3),
            "wall_seconds": round(wall, 3),
            "train_seconds": round(s.train_time, 3),
            "steps": s.step,
            "epochs": round(s.step / max(1, len(self.batches)), 3),
            "best_accuracy": s.best_accuracy,
            "final_accuracy": s.final_accuracy,
            # which target the job set (accuracy or loss; None: none), and its value under target_<metric>
            "target_metric": None if target is None else target[0],
            "target_accuracy": self.t.get("targetAccuracy"),
            "target_loss": self.t.get("targetLoss"),
            "target_hold": self.t["targetHold"],
            # the time to the job's target, whichever it set (the name is older than loss targets)
            "time_to_accuracy_s": None if s.tta is None else round(s.tta, 3),
            # said outright, so that a missed target is never just a missing number
            "target_reached": None if target is None else s.tta is not None,
            "final_loss": round(s.last_loss, 5),  # the last training step's loss (its batch)
            # the evaluations' mean loss (evalSamples of the test data): what targetLoss reads
            "best_eval_loss": None if s.best_eval_loss is None else round(s.best_eval_loss, 5),
            "final_eval_loss": None if s.final_eval_loss is None else round(s.final_eval_loss, 5),
            "mean_density": round(sum(h["density"] for h in compressed) / len(compressed), 6) if hist else 1.0,
            "dense_warmup_steps": sum(1 for h in hist if h["warmup"]),
            # why the dense steps were dense: warm-up (warmupSteps, PowerSGD's startIter), controller (chosen),
            # it), method (allreduce, fp16: every step); a method that compresses pays none it did not choose
            "dense_steps": dict(Counter(h["dense_reason"] for h in hist if h.get("dense"))),
            "probe_steps": sum(1 for h in hist if h.get("probe")),
            "lowrank_steps": sum(1 for h in hist if h.get("lowrank_rank") and not h.get("dense")),
            "bytes_sent_per_worker": int(wire),
            # bytes on the wire over the training clock: never above the link for long
            "wire_goodput_mbit": round(wire * 8 / s.train_time / 1e6, 3) if s.train_time > 0 else None,
            # bytes over the time the collectives were busy: what the estimator samples
            "collective_rate_mbit": round(wire * 8 / comm / 1e6, 3) if comm > 0 else None,
            "comm_seconds": round(comm, 3),
            "selection_ms_mean": round(1e3 * sum(h["selection_seconds"] for h in hist) / max(1, len(hist)), 3),
            "link_mean_rate_mbit": None if link is None else round(link, 3),
            # the rates the steps trained under (a fluctuating link that barely moved before the target says so)
            "link_rate_mbit_min": rates[0] if rates else None,
            "link_rate_mbit_median": rates[len(rates) // 2] if rates else None,
            "link_rate_mbit_max": rates[-1] if rates else None,
            "value_encoding": self._value_encoding(),
            "wire_bytes_per_element": round(sum(h["wire_bytes"] for h in topk) / sent, 3) if sent else None,
            "backend": self.backend,
            "device": str(self.device),
            # on CUDA the collectives' times are CUDA events on the stream (a completion callback there means
            # only "enqueued"), elsewhere the wall clock at completion
            "collective_timer": ("modeled" if self.clock.simulated else
                                 "cuda-events" if self.device.type == "cuda" else "wall-clock"),
            "accuracy_curve": [[st, round(t, 3), a] for st, t, a in s.accuracies],
            # unrounded, as the target was judged (a reader of the curve reaches the same verdict)
            "loss_curve": [[st, round(t, 3), v] for st, t, v in s.eval_losses],
            # tta's measured steps factors (netsense calibrate): which file, and what measuring them cost
            "penalties": self._penalties_record(),
            # valid but never met: a profile's changes after the training ended
            "warnings": [unseen_message(unseen, s.train_time, "this run's training")]
            if (unseen := unseen_changes(self.profile, s.train_time)) else [],
            "clock": "simulated" if self.clock.simulated else "real",
            "simulation": self.simulation,
            # a fixed method's steps as the simulated clock priced them (netsense.clock.replay): its training
            # never reads the clock, so the same steps price on any other link; None for a controller's
            "step_shapes": self.clock.shapes if self.clock.simulated else None,
            # spec.training.readingSteps: what each candidate compressor would keep of this rank's gradient
            "reading": None if self.reading is None else self.reading.record(),
        }


def _mbit(bytes_per_s: float | None) -> float | None:
    return None if not bytes_per_s else round(bytes_per_s * 8 / 1e6, 3)


def _ms(seconds: float | None) -> float | None:
    return None if not seconds else round(seconds * 1e3, 3)


def worker_main() -> int:
    """`netsense worker`: train as configured by the environment; exit 0/1."""
    try:
        with open(os.environ[gang.JOB_FILE_ENV]) as fh:
            doc = json.load(fh)
        job = parse_spec(doc["spec"], doc.get("metadata", {}).get("name", "job"))
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError, OSError) as e:
        print(f"netsense worker: bad environment: {e}", file=sys.stderr)
        return 2
    trainer = Trainer(job, rank, world, os.environ.get(gang.PROFILE_START_ENV))
    stopped: list[int] = []  # the signal that ends this worker (SIGTERM: a Ctrl-C'd run, a deleted pod)

    def on_signal(signum, _frame):
        stopped.append(signum)
        raise Terminated(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    try:
        trainer.setup()
        result = trainer.train()
    except (Exception, Terminated, KeyboardInterrupt) as e:
        if stopped or not isinstance(e, Exception):  # interrupted (a collective may fail first, as peers stop)
            _keep_artifacts(trainer, rank, trainer.interrupted_result() if rank == 0 else None)
            return 128 + (stopped[0] if stopped else signal.SIGINT)
        # report one line, then fail the pod / process
        print(f"netsense worker rank {rank}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        _write_termination(f"rank {rank}: {type(e).__name__}: {e}"[:4000])
        _keep_artifacts(trainer, rank)  # what it had, for the post-mortem
        return 1
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass
    if rank == 0:
        summary = os.environ.get(gang.QUEUE_SUMMARY_ENV)  # on a cluster: this pod's shaped link(s)
        if summary and (links := read_summary(summary)):
            result["bottleneck"] = {"links": links}
        if os.environ.get(gang.OUTPUT_URI_ENV):
            result["artifacts"] = os.environ[gang.OUTPUT_URI_ENV]
    _keep_artifacts(trainer, rank, result if rank == 0 else None)
    if rank == 0:
        _write_termination(compact({k: v for k, v in result.items() if k != "accuracy_curve"}))
        emit("result", **result)
    return 0


def _keep_artifacts(trainer: Trainer, rank: int, result: dict | None = None) -> None:
    """Into NETSENSE_OUT: rank 0's timeline (and its result, when it has one); on a cluster with spec.output, where
    each rank has a directory of its own, every rank's copy of its shaper's queue samples. A volume that cannot be
    written costs the artifacts, never the run: said on stderr."""
    out = os.environ.get(gang.OUT_DIR_ENV)
    if not out:
        return
    try:
        os.makedirs(out, exist_ok=True)
        if rank == 0:
            trainer.timeline.write_csv(os.path.join(out, "timeline.csv"))
            if result is not None:
                write_result(out, result)
        if queue := os.environ.get(gang.QUEUE_CSV_ENV):
            copy_complete_lines(queue, os.path.join(out, "queue.csv"))
    except OSError as e:
        print(f"netsense worker rank {rank}: could not write the artifacts to {out}: {e}", file=sys.stderr, flush=True)


def copy_complete_lines(src: str, dst: str) -> None:
    """``src`` as far as its last newline (the shaper may be writing a row at this moment)."""
    with open(src, "rb") as fh:
        data = fh.read()
    with open(dst, "wb") as fh:
        fh.write(data[: data.rfind(b"\n") + 1])


def _write_termination(text: str) -> None:
    path = os.environ.get(gang.RESULT_PATH_ENV)
    if path:
        try:
            with open(path, "w") as fh:
                fh.write(text)
        except OSError:
            pass


if __name__ == "__main__":
    sys.exit(worker_main())

