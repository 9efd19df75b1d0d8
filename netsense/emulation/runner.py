"""`netsense run`: one NetSenseJob on the local emulated cluster.

Builds the cluster (one namespace per rank), starts one ``netsense worker`` per
rank with the environment a pod would get, follows the bandwidth profile, shows
progress, restarts the whole gang on a worker failure (up to backoffLimit, as
the operator does), enforces activeDeadlineSeconds, and tears everything down.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from typing import TextIO

from netsense.emulation.bottleneck import Observers, cross_samples, queue_samples, summarize
from netsense.emulation.cluster import LocalCluster
from netsense.emulation.loopback import LoopbackHosts, free_port
from netsense.errors import NetsenseError, Terminated
from netsense.gang import (
    OUT_DIR_ENV,
    PROFILE_START_ENV,
    RENDEZVOUS_ENV,
    Verdict,
    judge,
    rank_failure,
    worker_env,
)
from netsense.shaping.profiles import build_profile
from netsense.spec import Job
from netsense.train.results import plot, write_result


class RunFailed(NetsenseError, RuntimeError):
    """A worker failed; the message is its own reason."""


class Progress:
    """One updating line on a terminal; a line every 10 s otherwise (CI logs)."""

    def __init__(self, stream: TextIO = sys.stderr, quiet: bool = False):
        self.stream, self.quiet = stream, quiet
        self.tty = stream.isatty()
        self.last_print = 0.0

    def show(self, ev: dict) -> None:
        if self.quiet:
            return
        step = ev.get("step")
        total = ev.get("max_steps")
        bar = ""
        if total:
            done = int(20 * step / total)
            bar = f"[{'#' * done}{'.' * (20 - done)}] "
        acc = ev.get("accuracy")
        rate = ev.get("rate_mbit")
        density = ev.get("density")
        line = (f"{bar}step {step}{'/' + str(total) if total else ''}  epoch {ev.get('epoch')}  "
                f"{ev.get('samples_per_s', 0):.1f} samples/s  loss {ev.get('loss')}"
                + (f"  density {density:.4f}" if density is not None else "")
                + (f"  link {rate:g} Mbit" if rate is not None else "")
                + (f"  acc {acc:.3f}" if acc is not None else ""))
        if self.tty:
            self.stream.write("\r\x1b[2K" + line)
            self.stream.flush()
        elif time.monotonic() - self.last_print >= 10:
            self.last_print = time.monotonic()
            print(line, file=self.stream, flush=True)

    def message(self, text: str) -> None:
        if self.tty and not self.quiet:
            self.stream.write("\r\x1b[2K")
        print(text, file=self.stream, flush=True)


def local_worker_env(job: Job, rank: int, master: str, out_dir: str, start_file: str | None,
                     master_port: int | None = None) -> dict[str, str]:
    """This machine's environment (PATH, the venv, ...) with the worker contract on top; eth0 is each
    host's one link here, shaped or not (on the simulated clock: loopback, and a rendezvous port of the run's
    own, as runs may go side by side)."""
    inherited = {k: v for k, v in os.environ.items() if k not in RENDEZVOUS_ENV}
    extra = {OUT_DIR_ENV: out_dir}
    if start_file is not None and rank == 0:
        extra[PROFILE_START_ENV] = start_file  # one follower shapes every link here
    if master_port is not None:
        extra["MASTER_PORT"] = str(master_port)
    interface = "lo" if job.network["clock"] == "simulated" else "eth0"
    return {**inherited, **worker_env(job, rank, master, job_file(out_dir), interface, extra)}


def job_file(out_dir: str) -> str:
    """Where the workers read the job (a file: an inlined trace can outgrow what one variable may hold)."""
    return os.path.abspath(os.path.join(out_dir, "job.json"))


def _last_line(path: str) -> str:
    try:
        with open(path, errors="replace") as fh:
            lines = [ln.strip() for ln in fh if ln.strip()]
    except OSError:
        return ""
    # Prefer our own one-line reason over a traceback's tail.
    for ln in reversed(lines):
        if ln.startswith("netsense worker"):
            return ln
    return lines[-1] if lines else ""


def run_gang(cluster: LocalCluster | LoopbackHosts, job: Job, out_dir: str, progress: Progress, attempt: int,
             started: float) -> Verdict | None:
    """Start all ranks and wait until all exit (None) or a verdict ends this gang (a rank failed, or the
    deadline counted from ``started`` passed)."""
    logs = os.path.join(out_dir, "logs")
    os.makedirs(logs, exist_ok=True)
    procs = []
    if cluster.start_file:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(cluster.start_file)
        if attempt > 0 and cluster.follower:
            cluster.follower.rewind()  # the new gang's clock starts at its own first step
    port = free_port() if isinstance(cluster, LoopbackHosts) else None
    for rank in range(job.workers):
        err = open(os.path.join(logs, f"worker-{rank}.attempt{attempt}.log"), "w")
        stdout = subprocess.PIPE if rank == 0 else err
        env = local_worker_env(job, rank, cluster.address(0), out_dir, cluster.start_file, port)
        procs.append(cluster.spawn_worker(rank, env, stdout=stdout, stderr=err))
        err.close()
    events_path = os.path.join(out_dir, "events.jsonl")

    def pump() -> None:
        with open(events_path, "a") as events:
            for data in procs[0].stdout:
                raw = data.decode(errors="replace")
                events.write(raw)
                try:
                    ev = json.loads(raw)
                except ValueError:
                    continue
                if ev.get("event") == "progress":
                    progress.show(ev)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    exited: dict[int, float] = {}  # when each rank's exit was first seen: the first failure is the cause
    while True:
        codes = [p.poll() for p in procs]
        for r, c in enumerate(codes):
            if c is not None:
                exited.setdefault(r, time.monotonic())
        failed = {r: _last_line(os.path.join(logs, f"worker-{r}.attempt{attempt}.log")) or f"exit code {c}"
                  for r, c in enumerate(codes) if c not in (None, 0)}
        verdict = judge(rank_failure(failed, exited), attempt, job.run_policy, time.monotonic() - started)
        if verdict:
            cluster.kill_processes()
            return verdict
        if all(c == 0 for c in codes):
            reader.join(timeout=5)
            return None
        time.sleep(0.2)


def run_job(job: Job, out_dir: str, quiet: bool = False, plot_timeline: bool = True) -> dict:
    """Run a validated job locally; returns result.json's content or raises RunFailed.
    ``plot_timeline``: draw timeline.png too (a second of CPU; the bench skips it). Interrupted (Ctrl-C,
    SIGTERM), it keeps what the run reached (result.json with status Interrupted, timeline.csv and the plot:
    rank 0 writes them when stopped) and then raises."""
    os.makedirs(out_dir, exist_ok=True)
    with open(job_file(out_dir), "w") as fh:
        json.dump(job.manifest(), fh)
    progress = Progress(quiet=quiet)
    try:
        tcp, flows = _run(job, out_dir, progress)
    except (KeyboardInterrupt, Terminated):
        progress.message("")
        _plot_interrupted(job, out_dir, plot_timeline)
        raise
    progress.message("")
    with open(os.path.join(out_dir, "result.json")) as fh:
        result = json.load(fh)
    if tcp is not None:
        result["tcp_congestion_control"] = tcp
    queue, cross = queue_samples(out_dir), cross_samples(out_dir)  # read once: a long run's queue.csv is large
    bottleneck = summarize(out_dir, flows, queue, cross)
    if bottleneck["links"] or flows:
        result["bottleneck"] = bottleneck
    write_result(out_dir, result)
    png = plot_timeline and plot(os.path.join(out_dir, "timeline.csv"), os.path.join(out_dir, "timeline.png"),
                                 f"{job.name}: {job.compression['method']}, {job.workers} workers",
                                 queue=queue, cross=cross, result=result)
    if png:
        result["plot"] = png
    return result


def _run(job: Job, out_dir: str, progress: Progress) -> tuple[str | None, list]:
    """The gang on the emulated cluster (or, on the simulated clock, on loopback), restarted as runPolicy says,
    until it ends; the cluster torn down. Returns the hosts' TCP congestion control and the cross-traffic flows."""
    profile = build_profile(job.network.get("profile"))
    started = time.monotonic()
    # The profile's clock starts at the first training step, not when the cluster is up:
    # start-up takes seconds and would otherwise shift every run's view of the profile.
    # The trainer publishes its training clock there; the queue samplers and cross traffic follow it too.
    start_file = os.path.join(out_dir, "profile-start")
    net = job.network
    simulated = net["clock"] == "simulated"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(start_file)
    with open(os.path.join(out_dir, "shaping.jsonl"), "w") as shaping_log, \
            (LoopbackHosts(job.workers) if simulated else
             LocalCluster(job.workers, profile, net["direction"], shaping_log=shaping_log, start_file=start_file,
                          topology=net["topology"], cross_hosts=bool(net.get("crossTraffic")))) as cluster:
        where = "on the simulated clock (loopback)" if simulated else f"in namespaces {cluster.bridge_ns[:-2]}*"
        progress.message(f"netsense: {job.name}: {job.workers} workers {where}, "
                         f"method {job.compression['method']}, topology {net['topology']}, "
                         f"profile {net.get('profile', {}).get('type', 'unshaped')}"
                         f"{', cross traffic' if net.get('crossTraffic') else ''}; output in {out_dir}")
        observers = Observers(cluster, None if simulated else net.get("crossTraffic"), out_dir,
                              None if simulated else start_file)
        if not simulated:
            observers.start()
        tcp = None if simulated else cluster.tcp_congestion_control()
        attempt = 0
        while verdict := run_gang(cluster, job, out_dir, progress, attempt, started):
            if not verdict.restart:
                _write_failure(out_dir, job, verdict.message)
                raise RunFailed(verdict.message)
            progress.message(f"netsense: {verdict.message}")
            attempt += 1
    return tcp, observers.flows


def _plot_interrupted(job: Job, out_dir: str, plot_timeline: bool) -> None:
    """After an interrupted run's teardown (its ranks had SIGTERM and the grace to write): its plot, where rank 0
    left a result and a timeline. Never raises: the interruption is what the caller reports."""
    try:
        with open(os.path.join(out_dir, "result.json")) as fh:
            result = json.load(fh)
        if plot_timeline and result.get("status") == "Interrupted":
            plot(os.path.join(out_dir, "timeline.csv"), os.path.join(out_dir, "timeline.png"),
                 f"{job.name}: {job.compression['method']}, {job.workers} workers (interrupted)", result=result)
    except Exception:  # noqa: BLE001 - nothing was kept, or it cannot be drawn: the run is interrupted either way
        pass


def _write_failure(out_dir: str, job: Job, reason: str) -> None:
    with open(os.path.join(out_dir, "result.json"), "w") as fh:
        json.dump({"job": job.name, "method": job.compression["method"], "workers": job.workers,
                   "model": job.training["model"], "dataset": job.training["dataset"],
                   "status": "Failed", "reason": reason}, fh, indent=2)
