"""The hosts of a run on the simulated clock: every rank a process of this machine, the collectives over
loopback, nothing shaped (the clock prices each step: netsense.clock.simulated). Needs no root and makes no
namespace, so simulated runs may go side by side; each has its own rendezvous port. Workers are forked from one
process that imported the trainer (netsense.emulation.forked), so 64 of them fit in this machine's memory."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Sequence
from typing import IO

from netsense.emulation.cluster import WORKER_ARGV, stop_processes
from netsense.emulation.forked import ForkedWorker, fork_worker

FORK_ENV = "NETSENSE_FORK_WORKERS"  # "0": spawn each worker as its own interpreter, as before forking (to compare)


class LoopbackHosts:
    """What the runner asks of a LocalCluster (spawn, address, kill_processes), for processes of this host."""

    start_file = None  # no shaper follows a clock: the trainer's clock is the model's
    follower = None

    def __init__(self, hosts: int):
        self.hosts = hosts
        self.processes: list[subprocess.Popen | ForkedWorker] = []

    def __enter__(self) -> LoopbackHosts:
        return self

    def __exit__(self, *exc) -> None:
        self.kill_processes()

    @staticmethod
    def address(i: int) -> str:
        return "127.0.0.1"

    def spawn(self, i: int, argv: Sequence[str], env: dict[str, str] | None = None,
              stdout: int | IO | None = None, stderr: int | IO | None = None) -> subprocess.Popen:
        """Start host i's process in a process group of its own (so it can be killed whole)."""
        proc = subprocess.Popen(list(argv), env=env, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        self.processes.append(proc)
        return proc

    def spawn_worker(self, i: int, env: dict[str, str], stdout: int | IO | None = None,
                     stderr: int | IO | None = None) -> ForkedWorker:
        """Start rank i's `netsense worker`, forked from the server that imported the trainer once
        (netsense.emulation.forked: one process a rank, torch's memory shared)."""
        if os.environ.get(FORK_ENV, "1") == "0":  # a fresh interpreter a rank (testbed/simulation/many_workers.py)
            return self.spawn(i, WORKER_ARGV, env, stdout, stderr)
        proc = fork_worker(env, stdout, stderr)
        self.processes.append(proc)
        return proc

    def kill_processes(self, grace_s: float = 5.0) -> None:
        stop_processes(self.processes, grace_s)


def free_port() -> int:
    """A TCP port free on loopback now (the kernel's choice): a simulated run's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
