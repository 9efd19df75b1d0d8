"""`netsense worker` with spec.procsPerWorker > 1: this pod's (or emulated host's) ranks, one process each.

As torchrun starts them: the worker's environment names its first rank (RANK) and how many it holds
(NETSENSE_PROCS_PER_WORKER); process i of them gets RANK + i and LOCAL_RANK i (its GPU: cuda:LOCAL_RANK), and
trains as a worker of one process would. DDP cannot lose a rank, so one that fails ends its siblings, and the
worker exits with the first failure's code (the gang then restarts whole, as for any failed worker). SIGTERM
(the pod deleted, Ctrl-C locally) reaches every process.

One process per worker speaks for it where one voice is needed: LOCAL_RANK 0 publishes the training clock to
the worker's shaper and copies the shaper's queue samples into the output (the others would write the same).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from netsense import gang

GRACE_S = 10.0  # siblings of a failed rank: SIGTERM, then SIGKILL after this long


def child_env(env: dict[str, str], local_rank: int) -> dict[str, str]:
    """Process ``local_rank``'s environment: its own RANK and LOCAL_RANK, a worker of one process."""
    child = {**env, "RANK": str(int(env["RANK"]) + local_rank), "LOCAL_RANK": str(local_rank), gang.PROCS_ENV: "1"}
    if local_rank:
        for name in (gang.PROFILE_START_ENV, gang.QUEUE_CSV_ENV):
            child.pop(name, None)
    return child


def launch(procs: int) -> int:
    children = [subprocess.Popen([sys.executable, "-m", "netsense", "worker"], env=child_env(dict(os.environ), i))
                for i in range(procs)]

    def forward(signum, _frame):
        for c in children:
            if c.poll() is None:
                c.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    failed = 0
    while any(c.poll() is None for c in children):
        failed = next((c.returncode for c in children if c.returncode not in (None, 0)), 0)
        if failed:
            break
        time.sleep(0.2)
    if failed:
        forward(signal.SIGTERM, None)
        deadline = time.monotonic() + GRACE_S
        for c in children:
            try:
                c.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                c.kill()
                c.wait()
        return failed
    return next((c.returncode for c in children if c.returncode), 0)
