"""testbed/gpu/check.sh in its dry mode: every step of the GPU check runs on the CPU (or says why it
cannot), so the script a GPU machine runs has not rotted by the time one is lent."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from support import REPO


@pytest.mark.root
def test_the_gpu_check_runs_dry_on_the_cpu_and_says_what_it_skipped(tmp_path):
    out = tmp_path / "gpu-check"
    proc = subprocess.run(["bash", os.path.join(REPO, "testbed", "gpu", "check.sh"), "--dry", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    steps = {s["name"]: s for s in summary["steps"]}
    assert list(steps) == ["cuda-tests", "shared-gpu-job", "nccl-smoke", "selection", "device-profile",
                           "cluster-path"]
    assert steps["cuda-tests"]["status"] == "skipped" and steps["cuda-tests"]["data"]["collected"] >= 5
    assert "--dry" in steps["cuda-tests"]["detail"]  # the reason is said, not implied
    for name in ("shared-gpu-job", "nccl-smoke", "selection", "device-profile", "cluster-path"):
        assert steps[name]["status"] == "dry", steps[name]
    job = steps["shared-gpu-job"]["data"]
    assert job["static"]["collective_timer"] == "wall-clock" and job["static"]["device"] == "cpu"
    assert job["step"]["link_rates_mbit"] == [50, 200]
    assert job["static"]["last_loss"] < job["static"]["first_loss"]
    assert set(steps["nccl-smoke"]["data"]) == {"allreduce", "fp16", "topk", "netsense", "tta", "powersgd"}
    samples = steps["cluster-path"]["data"]["samples"]
    assert set(samples) == {"paper-resnet18-200mbit.yaml", "paper-resnet18-fluctuating.yaml",
                            "paper-resnet18-steps.yaml"} and all(s["validated"] for s in samples.values())
    assert "nothing submitted (--dry)" in steps["cluster-path"]["detail"]
    assert (out / "summary.md").read_text().startswith("# GPU check: no GPU (dry run)")
    # The device profile's rows are the simulated clock's inputs for their training: a job given them runs on them.
    rows = json.loads((out / "device-profile.json").read_text())["rows"]
    assert [r["name"] for r in rows] == ["gru1d", "mlp1d"] and rows == steps["device-profile"]["data"]["rows"]
    from netsense.spec import parse_spec

    inputs = ("computeSeconds", "compressionSecondsPerMelement", "lowRankSecondsPerMelement")
    for r in rows:
        assert all(r[k] > 0 for k in inputs), r
        job = parse_spec({"training": {"model": r["model"], "dataset": r["dataset"], "batchSize": r["batchSize"]},
                          "network": {"clock": "simulated", "simulation": {k: r[k] for k in inputs}}})
        assert {k: job.network["simulation"][k] for k in inputs} == {k: r[k] for k in inputs}
