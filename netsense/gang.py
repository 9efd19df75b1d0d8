"""A job's gang of workers, decided the same way by both backends: the emulated cluster of `netsense run`
(netsense.emulation.runner) and the operator's pods (netsense_operator).

- the worker contract: the environment every rank's `netsense worker` gets;
- the lifecycle: a failed rank fails the whole gang (DDP cannot lose a rank), which restarts whole up to
  runPolicy.backoffLimit; activeDeadlineSeconds ends the job however many restarts are left.

Pure functions: no processes, no API calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the spec's pod-template rules name the containers below: no import at run time
    from netsense.spec import Job

MASTER_PORT = 29500  # rank 0's rendezvous (torch.distributed's env:// store)
TRAINER = "trainer"  # the trainer's container (its logs, its termination message)
SHAPER = "shaper"  # the shaping sidecar's container
CONTAINERS = (TRAINER, SHAPER)


def worker_env(job: Job, rank: int, master_addr: str, job_file: str, interface: str | None,
               extra: dict[str, str] | None = None) -> dict[str, str]:
    """The variables `netsense worker` reads.

    ``interface``: the shaped interface, where shaping binds. tc shapes what leaves through it, so gloo and
    NCCL are pinned to it and NCCL is kept off InfiniBand (which would bypass the shaper); None leaves the
    libraries to choose (an unshaped pod on a GPU cluster keeps its fast fabric).
    """
    env = {
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(MASTER_PORT),
        "WORLD_SIZE": str(job.workers),
        "RANK": str(rank),
        "LOCAL_RANK": "0",
        "NETSENSE_JOB_FILE": job_file,
        "OMP_NUM_THREADS": str(job.training["threads"]),
        "PYTHONUNBUFFERED": "1",
    }
    if interface:
        env.update({"GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": interface, "NCCL_IB_DISABLE": "1"})
    env.update(extra or {})
    return env


@dataclass(frozen=True)
class Verdict:
    """What a gang's state means for the job: restart the gang, or end the job Failed."""

    restart: bool
    reason: str  # a CamelCase reason, as Kubernetes conditions have them
    message: str


def rank_failure(failed: dict[int, str]) -> str | None:
    """The failure that names the gang's: the lowest failed rank's own reason (None: none failed)."""
    if not failed:
        return None
    rank = min(failed)
    return f"rank {rank} failed: {failed[rank]}"


def judge(failure: str | None, restarts: int, run_policy: dict, elapsed_s: float) -> Verdict | None:
    """None while no rank failed and the deadline (counted from the job's start) is not passed."""
    deadline = run_policy.get("activeDeadlineSeconds")
    if deadline and elapsed_s > deadline:
        return Verdict(False, "DeadlineExceeded", f"activeDeadlineSeconds ({deadline}s) exceeded")
    if failure is None:
        return None
    limit = run_policy["backoffLimit"]
    if restarts < limit:
        return Verdict(True, "WorkerFailed", f"{failure}; restarting the gang ({restarts + 1}/{limit})")
    return Verdict(False, "BackoffLimitExceeded", f"{failure} (backoffLimit {limit} reached)")
