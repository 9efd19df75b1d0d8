"""The gang's contract and lifecycle (netsense.gang), which both backends follow (pure unit tests)."""

from __future__ import annotations

import os

import pytest
from support import REPO

from netsense.gang import judge, rank_failure, worker_env
from netsense.spec import load_job

POLICY = {"backoffLimit": 2}


def test_the_first_rank_to_fail_names_the_failure():
    assert rank_failure({}) is None
    # rank 1 was OOMKilled; rank 0 died of it a moment later (its peer reset the connection)
    failed = {0: "Connection reset by peer", 1: "OOMKilled"}
    assert rank_failure(failed, {0: 100.4, 1: 100.0}) == "rank 1 failed: OOMKilled"
    assert rank_failure(failed) == "rank 0 failed: Connection reset by peer"  # unknown times: the lowest rank


@pytest.mark.parametrize("failure, restarts, policy, elapsed, want", [
    (None, 0, POLICY, 5.0, None),
    ("rank 0 failed: x", 0, POLICY, 5.0, (True, "WorkerFailed", "rank 0 failed: x; restarting the gang (1/2)")),
    ("rank 0 failed: x", 2, POLICY, 5.0, (False, "BackoffLimitExceeded", "rank 0 failed: x (backoffLimit 2 reached)")),
    # the deadline ends the job whatever restarts remain, failed rank or not
    (None, 0, {**POLICY, "activeDeadlineSeconds": 4}, 5.0, (False, "DeadlineExceeded", "activeDeadlineSeconds (4s) exceeded")),
    ("rank 0 failed: x", 0, {**POLICY, "activeDeadlineSeconds": 4}, 5.0,
     (False, "DeadlineExceeded", "activeDeadlineSeconds (4s) exceeded")),
])
def test_what_a_gangs_state_means_for_the_job(failure, restarts, policy, elapsed, want):
    verdict = judge(failure, restarts, policy, elapsed)
    assert (None if verdict is None else (verdict.restart, verdict.reason, verdict.message)) == want


def test_both_backends_give_every_rank_the_same_contract():
    from netsense_operator import resources

    from netsense.emulation.runner import local_worker_env

    job = load_job(os.path.join(REPO, "samples", "quick.yaml"))
    local = local_worker_env(job, 1, "10.0.0.1", "/tmp/out", None)
    pod = resources.worker_pod(job, "default", "uid-1", 1, 0)
    in_pod = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    contract = worker_env(job, 1, "x", "y", "eth0")
    for key in set(contract) - {"MASTER_ADDR", "NETSENSE_JOB_FILE"}:
        assert local[key] == in_pod[key] == contract[key], key


def test_only_a_shaped_interface_pins_the_libraries_and_keeps_nccl_off_infiniband():
    job = load_job(os.path.join(REPO, "samples", "quick.yaml"))
    assert worker_env(job, 0, "m", "f", "eth0")["NCCL_IB_DISABLE"] == "1"
    unshaped = worker_env(job, 0, "m", "f", None)
    assert not {"NCCL_IB_DISABLE", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"} & set(unshaped)


def test_several_processes_a_worker_get_torchruns_ranks():
    """procsPerWorker: the worker's environment names its first rank and the world of every process; the launcher
    gives process i RANK + i and LOCAL_RANK i, and only LOCAL_RANK 0 speaks to the shaper."""
    from netsense import gang
    from netsense.spec import parse_spec
    from netsense.train.launch import child_env

    job = parse_spec({"workers": 3, "procsPerWorker": 4, "training": {"model": "mlp", "dataset": "digits"}}, "p")
    env = gang.worker_env(job, 2, "w0", "/etc/job.json", "eth0",
                          {gang.PROFILE_START_ENV: "/run/start", gang.QUEUE_CSV_ENV: "/run/q.csv"})
    assert (env["RANK"], env["WORLD_SIZE"], env[gang.PROCS_ENV]) == ("8", "12", "4")
    ranks = [child_env(env, i) for i in range(4)]
    assert [(c["RANK"], c["LOCAL_RANK"], c[gang.PROCS_ENV]) for c in ranks] == [
        ("8", "0", "1"), ("9", "1", "1"), ("10", "2", "1"), ("11", "3", "1")]
    assert gang.PROFILE_START_ENV in ranks[0] and gang.QUEUE_CSV_ENV in ranks[0]
    assert all(gang.PROFILE_START_ENV not in c and gang.QUEUE_CSV_ENV not in c for c in ranks[1:])


def test_a_gpu_limit_below_the_processes_is_refused_naming_the_field():
    from netsense.spec import SpecError, parse_spec

    with pytest.raises(SpecError, match=r"spec.resources.limits.nvidia.com/gpu: 1 GPU\(s\) for procsPerWorker: 2"):
        parse_spec({"procsPerWorker": 2, "resources": {"limits": {"nvidia.com/gpu": 1}},
                    "training": {"model": "mlp", "dataset": "digits"}}, "g")
