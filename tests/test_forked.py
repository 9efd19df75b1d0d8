"""Workers forked from one server that imported the trainer (netsense.emulation.forked): the simulated clock's
ranks, one process each, sharing torch's memory so that 64 fit on this machine."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from support.procs import Watched

from netsense.emulation.cluster import stop_processes
from netsense.emulation.forked import fork_worker


def test_a_forked_worker_gets_its_own_environment_streams_and_exit_code(tmp_path):
    """The worker sees only the environment it is given (here none of the job's variables: it refuses to start,
    as `python -m netsense worker` would), writes to the streams it is given, and its exit code is the runner's."""
    err = open(tmp_path / "err.log", "w")
    os.environ["NETSENSE_JOB_FILE"] = "/nonexistent/job.json"  # the runner's own environment must not leak in
    try:
        worker = fork_worker({"PATH": os.environ["PATH"]}, stdout=subprocess.PIPE, stderr=err)
    finally:
        del os.environ["NETSENSE_JOB_FILE"]
        err.close()
    assert worker.wait(timeout=60) == 2
    assert worker.poll() == worker.returncode == 2
    assert worker.stdout.read() == b""  # the pipe closes with the worker
    assert "netsense worker: bad environment" in (tmp_path / "err.log").read_text()


def test_a_forked_worker_is_a_session_of_its_own_and_is_stopped_whole(tmp_path):
    """Like a spawned worker: its own session (SIGTERM to its group reaches it and only it), stopped by
    stop_processes within the grace period."""
    job = tmp_path / "job.json"
    job.write_text('{"spec": {}}')  # parses to an error only after the worker's imports: give it time to live
    worker = fork_worker({"PATH": os.environ["PATH"], "NETSENSE_JOB_FILE": str(job), "RANK": "0",
                          "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"},
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert os.getsid(worker.pid) == worker.pid != os.getsid(0)
    procs = [worker]
    started = time.monotonic()
    stop_processes(procs, grace_s=5)
    assert worker.poll() is not None and time.monotonic() - started < 15
    assert procs == []


@pytest.mark.gloo
def test_a_simulated_runs_workers_are_forked_and_share_torchs_memory(tmp_path):
    """Each rank's private memory is what it allocated, not its own copy of torch's relocated libraries (~310 MiB
    a spawned worker on this machine, ~135 forked: testbed/EVALUATION.md, "At scale")."""
    import yaml

    doc = {"apiVersion": "netsense.dev/v1alpha1", "kind": "NetSenseJob", "metadata": {"name": "forked"},
           "spec": {"workers": 2, "training": {"model": "mlp", "hiddenSize": 64, "dataset": "digits",
                                               "batchSize": 8, "maxSteps": 100000, "lr": 0.05, "evalEvery": 1000},
                    "compression": {"method": "topk", "density": 0.01},
                    "network": {"clock": "simulated", "profile": {"type": "static", "rate": "100Mbit"}}}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    import sys

    with Watched.popen([sys.executable, "-m", "netsense", "run", str(path), "--out", str(tmp_path / "o"), "--quiet"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as run:
        deadline = time.monotonic() + 120
        while not (tmp_path / "o" / "events.jsonl").exists() or not (tmp_path / "o" / "events.jsonl").stat().st_size:
            assert run.proc.poll() is None and time.monotonic() < deadline, run.proc.stderr.read()
            time.sleep(0.2)
        ranks = run.rank(1)
        assert ranks, "rank 1 is not running"
        private = _private_mib(next(iter(ranks)))
        run.proc.terminate()
        run.proc.wait(timeout=60)
    assert private < 200, f"rank 1 holds {private} MiB of its own: not sharing the server's torch"


def _private_mib(pid: int) -> float:
    with open(f"/proc/{pid}/smaps_rollup") as fh:
        fields = dict(line.split(":", 1) for line in fh if ":" in line)
    return (int(fields["Private_Dirty"].split()[0]) + int(fields["Private_Clean"].split()[0])) / 1024
