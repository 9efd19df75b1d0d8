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

# What a worker pod asks for where the job says nothing, and its shaping sidecar always: the operator's pods and
# `netsense bench --cluster`'s count of how many cells fit side by side.
TRAINER_RESOURCES = {"requests": {"cpu": "1", "memory": "1Gi"}}
SHAPER_RESOURCES = {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "256Mi"}}

# The variables `netsense worker` reads (netsense.train.trainer), written by both backends.
RENDEZVOUS_ENV = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK")  # torch's env://
JOB_FILE_ENV = "NETSENSE_JOB_FILE"  # the job (job.json): a file, as a trace can outgrow one variable
OUT_DIR_ENV = "NETSENSE_OUT"  # where the worker writes timeline and result (local runs; spec.output on a cluster)
OUTPUT_URI_ENV = "NETSENSE_OUTPUT_URI"  # pvc://<claim>/<the attempt's directory>: result["artifacts"]
PROCS_ENV = "NETSENSE_PROCS_PER_WORKER"  # more than 1: `netsense worker` starts that many ranks (RANK .. RANK+n-1)
QUEUE_CSV_ENV = "NETSENSE_QUEUE_CSV"  # the shaper's queue samples (read-only here): copied into the output
RESULT_PATH_ENV = "NETSENSE_RESULT_PATH"  # rank 0's result.json, also here (a pod's termination message)
PROFILE_START_ENV = "NETSENSE_PROFILE_START_FILE"  # rank 0 writes the training clock's start there
QUEUE_SUMMARY_ENV = "NETSENSE_QUEUE_SUMMARY"  # the shaper's queue summary, for rank 0's result
# The variables that choose which interface or network the collectives use. With a profile set the operator
# pins them (below) and a job may not set them: they would move the training traffic off the shaped interface.
TRANSPORT_ENV = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")
TRANSPORT_ENV_PREFIXES = ("NCCL_IB_", "NCCL_NET", "NCCL_COLLNET")


def worker_env(job: Job, rank: int, master_addr: str, job_file: str, interface: str | None,
               extra: dict[str, str] | None = None) -> dict[str, str]:
    """The variables `netsense worker` reads, for worker (pod, host) ``rank``.

    ``interface``: the shaped interface, where shaping binds. tc shapes what leaves through it, so gloo, NCCL
    and TensorPipe are pinned to it, and NCCL to its socket transport (no InfiniBand, no network plugin, no
    CollNet: each would bypass the shaper). Variables given here win over a container's envFrom. None leaves
    the libraries to choose (an unshaped pod on a GPU cluster keeps its fast fabric).
    """
    procs = job.procs_per_worker
    env = {
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(MASTER_PORT),
        "WORLD_SIZE": str(job.world),
        "RANK": str(rank * procs),  # the worker's first process; `netsense worker` starts the others (procs)
        "LOCAL_RANK": "0",
        PROCS_ENV: str(procs),
        JOB_FILE_ENV: job_file,
        "OMP_NUM_THREADS": str(job.training["threads"]),
        "PYTHONUNBUFFERED": "1",
    }
    if interface:
        env.update({name: interface for name in TRANSPORT_ENV})
        env.update({"NCCL_IB_DISABLE": "1", "NCCL_NET": "Socket", "NCCL_COLLNET_ENABLE": "0"})
    env.update(extra or {})
    return env


@dataclass(frozen=True)
class Verdict:
    """What a gang's state means for the job: restart the gang, or end the job Failed."""

    restart: bool
    reason: str  # a CamelCase reason, as Kubernetes conditions have them
    message: str


def rank_failure(failed: dict[int, str], ended: dict[int, float] | None = None) -> str | None:
    """The failure that names the gang's (None: none failed): the first rank to fail, by ``ended`` (when
    each failed rank ended; the lowest rank among ties or where unknown). The first is the cause: the
    others die of it a moment later (a reset connection), and their messages say only that."""
    if not failed:
        return None
    ended = ended or {}
    rank = min(failed, key=lambda r: (ended.get(r, float("inf")), r))
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
