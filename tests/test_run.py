"""`netsense run` end to end on the emulated cluster (root), and its input errors."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from support import REPO
from support.procs import Watched, cmdline, leaked_namespaces, ours

NETSENSE = [sys.executable, "-m", "netsense"]
RESULT_KEYS = {"job", "method", "workers", "model", "dataset", "status", "throughput_samples_per_s",
               "wall_seconds", "steps", "best_accuracy", "final_accuracy", "target_accuracy",
               "time_to_accuracy_s", "mean_density", "bytes_sent_per_worker", "link_mean_rate_mbit"}


def start(*args: str, **kwargs) -> Watched:
    """`netsense ARGS` as a child whose processes and namespaces this test alone watches (and kills, if the
    test fails before the run ends)."""
    return Watched.popen([*NETSENSE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def finish(run: Watched, timeout: float) -> tuple[int, str, str]:
    out, err = run.proc.communicate(timeout=timeout)
    return run.proc.returncode, out, err


def nothing_left(run: Watched, before: set[str]) -> None:
    assert not leaked_namespaces(before, run.pid), "namespaces left behind"
    assert not run.leftovers(), "processes left behind"


def wait_for_progress(run: Watched, events, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not (events.exists() and "progress" in events.read_text()):
        assert run.proc.poll() is None, run.proc.stderr.read()
        time.sleep(0.2)
    assert events.exists(), "the run never made progress"


def job(**spec) -> dict:
    base = {"workers": 2, "training": {"model": "mlp", "dataset": "digits", "maxSteps": 30, "hiddenSize": 64},
            "compression": {"method": "topk", "density": 0.1},
            "network": {"profile": {"type": "static", "rate": "100Mbit"}}}
    for k, v in spec.items():
        replace = k == "compression" and "method" in v  # another method: the base's settings are not its own
        base[k] = {**base.get(k, {}), **v} if isinstance(v, dict) and not replace else v
    return {"apiVersion": "netsense.dev/v1alpha1", "kind": "NetSenseJob", "metadata": {"name": "t"}, "spec": base}


def write(tmp_path, doc, name="job.yaml") -> str:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return str(path)


@pytest.mark.parametrize("doc, field", [
    ("spec: [unclosed", "not valid YAML"),
    ({"apiVersion": "netsense.dev/v1alpha1", "kind": "NetSenseJob", "spec": {}}, "metadata.name"),
    (job(workers=-1), "spec.workers"),
    (job(training={"model": "transformer9000"}), "spec.training.model"),
    (job(compression={"method": "zip"}), "spec.compression.method"),
    (job(network={"profile": {"type": "static", "rate": "fast"}}), "spec.network.profile.rate"),
    (job(training={"dataset": "cifar10", "dataPath": "/nonexistent/cifar"}), "spec.training.dataPath"),
])
def test_bad_input_is_one_line_naming_the_field_exit_2_nothing_created(tmp_path, doc, field):
    before = ours()
    with start("run", write(tmp_path, doc), "--out", str(tmp_path / "out")) as run:
        code, _, err = finish(run, 60)
        assert code == 2, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and field in lines[0], err
        assert not (tmp_path / "out").exists()
        nothing_left(run, before)


@pytest.mark.root
def test_a_kernel_without_netem_is_bad_input_exit_2_nothing_created(tmp_path):
    from netsense.emulation.cluster import kernel_has_netem

    if kernel_has_netem():
        pytest.skip("this kernel has netem: a delay profile runs here")
    doc = job(network={"profile": {"type": "static", "rate": "100Mbit", "delay": "20ms"}})
    before = ours()
    with start("run", write(tmp_path, doc), "--out", str(tmp_path / "out")) as run:
        code, _, err = finish(run, 60)
        assert code == 2, err
        assert err.strip().splitlines() == ["netsense: this kernel has no netem qdisc: delay/jitter/loss profiles "
                                            "cannot run here"]
        nothing_left(run, before)


def test_validate_lists_every_error(tmp_path):
    doc = job(workers=0, training={"model": "resnet", "batchSize": "big", "targetAcuracy": 0.9})
    proc = subprocess.run([*NETSENSE, "validate", write(tmp_path, doc)], capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 4, "one error a line"
    for line, field in zip(sorted(lines), sorted(["spec.workers", "spec.training.model", "spec.training.batchSize",
                                                   "spec.training.targetAcuracy"]), strict=True):
        assert line.startswith(f"netsense: {field}:"), line
    assert "did you mean 'targetAccuracy'?" in proc.stderr and "did you mean 'resnet18'?" in proc.stderr


def test_an_old_method_name_is_one_warning_line(tmp_path):
    proc = subprocess.run([*NETSENSE, "validate", write(tmp_path, job(compression={"method": "overlap"}))],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "netsense: warning: spec.compression.method: 'overlap' is now 'tta' (the old name still works, for now)"]


@pytest.mark.root
@pytest.mark.timeout(600)
def test_quick_sample_runs_and_writes_results(tmp_path):
    out, before = tmp_path / "out", ours()
    with start("run", os.path.join(REPO, "samples", "quick.yaml"), "--out", str(out)) as run:
        code, _, err = finish(run, 600)
        assert code == 0, err
        nothing_left(run, before)
    result = json.loads((out / "result.json").read_text())
    assert RESULT_KEYS <= set(result)
    assert result["status"] == "Succeeded" and result["workers"] == 2
    assert result["best_accuracy"] >= 0.85  # real digits, real learning
    assert result["link_mean_rate_mbit"] == pytest.approx(50.0)
    # The target counts once held for target_hold evaluations in a row; TTA is the first of them.
    curve, hold, target = result["accuracy_curve"], result["target_hold"], result["target_accuracy"]
    assert hold == 3
    held = [i for i in range(len(curve) - hold + 1) if all(a >= target for _, _, a in curve[i:i + hold])]
    assert result["time_to_accuracy_s"] == (curve[held[0]][1] if held else None)
    header = (out / "timeline.csv").read_text().splitlines()[0].split(",")
    for col in ("time", "step", "loss", "density", "lowrank_rank", "bytes", "est_btlbw_mbit", "est_rtprop_ms", "link_rate_mbit",
                "dense_reason", "probe"):
        assert col in header
    # No dense first step: tta's step 0 is its 64 kB probe; a dense step, if any, is its own choice.
    with open(out / "timeline.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert rows[0]["probe"] == "1" and float(rows[0]["density"]) < 0.1 and rows[0]["dense_reason"] == ""
    assert set(result["dense_steps"]) <= {"controller"} and result["dense_warmup_steps"] == 0
    assert sum(r["dense_reason"] == "controller" for r in rows) == result["dense_steps"].get("controller", 0)
    assert (out / "timeline.png").stat().st_size > 10_000


@pytest.mark.root
def test_resnet18_at_200mbit_the_shaping_binds(tmp_path):
    doc = job(training={"model": "resnet18", "dataset": "synthetic", "batchSize": 16, "maxSteps": 5,
                        "syntheticSamples": 256, "syntheticClasses": 100},
              compression={"method": "allreduce"},
              network={"profile": {"type": "static", "rate": "200Mbit"}})
    out = tmp_path / "out"
    with start("run", write(tmp_path, doc), "--out", str(out), "--quiet") as run:
        code, _, err = finish(run, 600)
    assert code == 0, err
    r = json.loads((out / "result.json").read_text())
    assert r["mean_density"] == pytest.approx(1.0)
    assert r["bytes_sent_per_worker"] >= 5 * 44e6  # ResNet18-CIFAR100: 11.2M fp32 gradients per step
    assert r["wire_goodput_mbit"] <= 200 * 1.05, r  # bytes over the training clock: never above the link
    assert 200 * 0.7 <= r["collective_rate_mbit"] <= 200 * 1.05, r  # bytes over the collectives' busy time


@pytest.mark.root
def test_a_failing_worker_fails_the_run_with_its_reason(tmp_path):
    # batch 2000 x 2 workers exceeds the 1437 digits training samples: every attempt fails.
    doc = job(training={"batchSize": 2000}, runPolicy={"backoffLimit": 1})
    before = ours()
    with start("run", write(tmp_path, doc), "--out", str(tmp_path / "o")) as run:
        code, _, err = finish(run, 300)
        assert code == 1, err
        assert "spec.training.batchSize" in err.strip().splitlines()[-1]
        assert "restarting the gang (1/1)" in err
        assert json.loads((tmp_path / "o" / "result.json").read_text())["status"] == "Failed"
        nothing_left(run, before)


@pytest.mark.root
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupting_a_run_leaves_nothing_behind(tmp_path, sig, code):
    doc = job(training={"maxSteps": 100000}, network={"profile": {"type": "steps", "from": "100Mbit",
                                                                   "to": "10Mbit", "by": "10Mbit", "every": "1s"}})
    # A shell without job control starts background commands with SIGINT ignored, and the
    # run would inherit that; give it the default disposition a terminal's Ctrl-C meets.
    before = ours()
    with start("run", write(tmp_path, doc), "--out", str(tmp_path / "o"),
               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) as run:
        wait_for_progress(run, tmp_path / "o" / "events.jsonl")
        assert len(run.namespaces()) >= 3 and run.with_env(RANK="1"), "the run's cluster and workers"
        run.proc.send_signal(sig)
        got, out, err = finish(run, 60)
        assert got == code, err
        assert "cleaned up" in err
        nothing_left(run, before)
    kept_what_it_reached(tmp_path / "o", out)


def kept_what_it_reached(out_dir, stdout: str) -> None:
    """An interrupted run keeps its results: result.json (status Interrupted, the steps it trained), the timeline
    and its plot; the summary says so."""
    result = json.loads((out_dir / "result.json").read_text())
    assert result["status"] == "Interrupted" and result["steps"] > 0, result
    rows = list(csv.DictReader(io.StringIO((out_dir / "timeline.csv").read_text())))
    assert len(rows) >= result["steps"] - 1 and (out_dir / "timeline.png").exists()
    assert stdout.startswith("t: Interrupted"), stdout


@pytest.mark.gloo
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_run_on_the_simulated_clock_keeps_what_it_reached(tmp_path, sig, code):
    """No root: the simulated clock's ranks are processes of this machine."""
    doc = job(training={"maxSteps": 100000}, network={"clock": "simulated", "profile": {"type": "static",
                                                                                          "rate": "100Mbit"}})
    with start("run", write(tmp_path, doc), "--out", str(tmp_path / "o"),
               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) as run:
        wait_for_progress(run, tmp_path / "o" / "events.jsonl")
        assert run.rank(1), "rank 1 is not running"
        run.proc.send_signal(sig)
        got, out, err = finish(run, 60)
        assert got == code, err
        assert "kept what it reached" in err and "cleaned up" in err
        assert not run.rank(1), "a worker outlived the run"
        assert not run.leftovers(), "processes left behind (a worker, or the server it was forked from)"
    kept_what_it_reached(tmp_path / "o", out)


@pytest.mark.root
def test_a_hung_worker_ends_the_run_within_the_collective_timeout(tmp_path):
    doc = job(training={"maxSteps": 100000}, runPolicy={"backoffLimit": 0})
    env = {**os.environ, "NETSENSE_TIMEOUT": "10"}
    before = ours()
    with start("run", write(tmp_path, doc), "--out", str(tmp_path / "o"), env=env) as run:
        wait_for_progress(run, tmp_path / "o" / "events.jsonl")
        # Freeze this run's rank 1 as a hung process would be: rank 0 must give up, not wait forever.
        frozen = [pid for pid in run.with_env(RANK="1") if "worker" in cmdline(pid)]
        assert frozen, "rank 1's worker"
        os.kill(frozen[0], signal.SIGSTOP)
        began = time.monotonic()
        code, _, err = finish(run, 120)
        assert code == 1, err
        assert time.monotonic() - began < 60
        assert "rank 0 failed" in err.strip().splitlines()[-1]
        nothing_left(run, before)


@pytest.mark.root
def test_a_time_varying_profile_runs_on_the_training_clock(tmp_path):
    # Worker start-up takes seconds, and evaluation (every 5 steps here) is off the training
    # clock: a profile clocked from cluster start, or on wall time, would change too early.
    doc = job(training={"maxSteps": 100000, "maxSeconds": "3s", "evalEvery": 5, "evalSamples": 360},
              network={"profile": {"type": "steps", "steps": [{"at": "0s", "rate": "100Mbit"},
                                                              {"at": "1.5s", "rate": "10Mbit"}]}})
    out = tmp_path / "out"
    with start("run", write(tmp_path, doc), "--out", str(out), "--quiet") as run:
        code, _, err = finish(run, 300)
    assert code == 0, err
    shaping = [json.loads(line) for line in (out / "shaping.jsonl").read_text().splitlines()]
    clock = next(ev for ev in shaping if ev["event"] == "clock")
    change = next(ev for ev in shaping if ev["event"] == "rate")
    # Applied once the training clock reads 1.5 s: never before; after by what a loaded machine delays a poll of
    # the clock and one tc call (150 ms each seen here), no more.
    assert change["rate_bps"] == 10e6 and 1.5 <= change["t"] <= 1.5 + 0.35, change
    with open(out / "timeline.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert float(rows[0]["link_rate_mbit"]) == 100.0 and float(rows[-1]["link_rate_mbit"]) == 10.0
    # The change lands where the training clock reads 1.5 s, later on the wall clock by the evaluations.
    first_slow = next(r for r in rows if float(r["link_rate_mbit"]) == 10.0)
    assert 1.5 <= float(first_slow["time"]) <= 1.5 + 0.3
    evaluations = json.loads((out / "result.json").read_text())["wall_seconds"] - 3.0
    assert evaluations > 0.1 and change["time"] - clock["epoch"] > 1.5 + 0.05


def _stopped(pids) -> list[int]:
    """Those of ``pids`` stopped by a signal (state T): what a test's SIGSTOP would leave."""
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                    out.append(pid)
        except OSError:
            pass
    return out


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.timeout(600)
def test_a_run_beside_the_tests_is_left_alone(tmp_path):
    """A user's run (or a benchmark) on the machine while the suite runs: what the tests do to their own runs
    (interrupt one, freeze a rank, `netsense clean`, check for leaks) never reaches it: it keeps its namespaces
    and processes, keeps training, and its owner can still stop it cleanly. (Its budget is long: on a loaded
    machine the checks took over a minute, and a bystander that simply finished would prove nothing.)"""
    bystander = job(training={"maxSteps": 100000, "maxSeconds": "600s", "evalEvery": 10**6},
                    network={"profile": {"type": "static", "rate": "10Mbit"}})
    before = ours()
    with start("run", write(tmp_path, bystander, "bystander.yaml"), "--out", str(tmp_path / "b"), "--quiet") as other:
        wait_for_progress(other, tmp_path / "b" / "events.jsonl")
        theirs, their_procs = other.namespaces(), other.processes()
        assert len(theirs) >= 3 and their_procs
        # Another run, interrupted and one of its ranks frozen, as the tests above do to their own.
        with start("run", write(tmp_path, job(training={"maxSteps": 100000})), "--out", str(tmp_path / "o")) as mine:
            wait_for_progress(mine, tmp_path / "o" / "events.jsonl")
            os.kill(mine.with_env(RANK="1")[0], signal.SIGSTOP)
            mine.proc.send_signal(signal.SIGINT)
            finish(mine, 60)
            nothing_left(mine, before | set(theirs))
        assert subprocess.run([*NETSENSE, "clean"], capture_output=True, timeout=60).returncode == 0
        assert not leaked_namespaces(before | set(theirs), os.getpid())
        assert other.proc.poll() is None, "the bystander ended while the tests ran: " + other.proc.stderr.read()
        assert other.namespaces() == theirs, "the bystander's namespaces were touched"
        assert set(other.processes()) >= set(their_procs), "a bystander's process was killed"
        assert not _stopped(their_procs), "a bystander's process was stopped"
        events = tmp_path / "b" / "events.jsonl"
        seen, deadline = events.read_text().count("progress"), time.monotonic() + 120
        while events.read_text().count("progress") <= seen:
            assert time.monotonic() < deadline, "the bystander stopped training"
            time.sleep(0.5)
        other.proc.send_signal(signal.SIGINT)
        code, _, err = finish(other, 120)
        assert code == 130, err
        nothing_left(other, before)


def test_every_subcommand_explains_itself_in_its_help():
    """`netsense COMMAND --help` says what the command does, not only its usage line."""
    from netsense.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, parser in sub.choices.items():
        if name in ("operator", "testbed"):  # the operator's own --help; the deprecated spelling
            continue
        assert parser.description and len(parser.description) > 40, f"`netsense {name} --help` has no description"
    grid_help = sub.choices["bench"].format_help()  # the grid file's format, every optional key
    assert "A grid file::" in grid_help and "ceiling: matched" in grid_help and "accuracyAfterEpochs" in grid_help


@pytest.mark.root
def test_an_unshaped_run_of_several_workers_trains(tmp_path):
    """No profile: only rank 0 publishes the training clock locally, and a clock broadcast only rank 0 entered
    hung every unshaped run of two workers or more until the collective timeout."""
    doc = job(training={"maxSteps": 20})
    del doc["spec"]["network"]
    before = ours()
    with start("run", write(tmp_path, doc), "--out", str(tmp_path / "o"), "--quiet") as run:
        code, _, err = finish(run, 120)
        assert code == 0, err
        nothing_left(run, before)
    assert json.loads((tmp_path / "o" / "result.json").read_text())["steps"] == 20


@pytest.mark.root
def test_several_processes_a_worker_train_as_one_gang(tmp_path):
    """procsPerWorker: 2 on 2 emulated hosts: four ranks (torchrun-style, LOCAL_RANK 0 and 1 on each host) in one
    process group, and nothing left behind."""
    doc = job(workers=2, procsPerWorker=2, training={"maxSteps": 15, "batchSize": 16})
    before = ours()
    with start("run", write(tmp_path, doc), "--out", str(tmp_path / "o"), "--quiet") as run:
        code, _, err = finish(run, 300)
        assert code == 0, err
        nothing_left(run, before)
    result = json.loads((tmp_path / "o" / "result.json").read_text())
    assert result["status"] == "Succeeded" and result["workers"] == 4 and result["steps"] == 15


@pytest.mark.gloo
def test_tta_with_low_ranks_runs_powersgd_end_to_end_without_root(tmp_path):
    """tta with lowRanks, as a user runs it (netsense run; the simulated clock: no root, and deterministic, so
    what tta chooses is not left to the machine's load): at 1 Mbit its PowerSGD option is the cheapest, and each
    low-rank step records its rank and sends what the rank-2 factors weigh at tta's fp16 values."""
    from netsense.compression.lowrank import layout
    from netsense.control.cost import lowrank_allreduce_bytes
    from netsense.train.models import build_model

    doc = job(training={"model": "mlp", "hiddenSize": 1024, "maxSteps": 30, "evalEvery": 10},
              compression={"method": "tta", "lowRanks": [2], "lowRankKnee": 0.05},
              network={"clock": "simulated", "simulation": {"computeSeconds": 0.004,
                                                            "compressionSecondsPerMelement": 0.005,
                                                            "lowRankSecondsPerMelement": 0.007},
                       "profile": {"type": "static", "rate": "1Mbit"}})
    with start("run", write(tmp_path, doc), "--out", str(tmp_path / "o"), "--quiet") as run:
        code, _, err = finish(run, 300)
    assert code == 0, err
    result = json.loads((tmp_path / "o" / "result.json").read_text())
    rows = list(csv.DictReader(io.StringIO((tmp_path / "o" / "timeline.csv").read_text())))
    low = [r for r in rows if r["lowrank_rank"]]
    assert result["lowrank_steps"] == len(low) >= 25, [r["lowrank_rank"] for r in rows]
    model = build_model("mlp", (64,), 10, 1024)
    matrices, whole = layout([tuple(p.shape) for p in model.parameters()], 2)
    wire = lowrank_allreduce_bytes(matrices, whole, 2, 2, fp16=True)
    assert all(r["lowrank_rank"] == "2" for r in low)
    ordinary = [float(r["bytes"]) for r in low if r["probe"] == "0"]  # a probe pads its step with zeros
    assert len(ordinary) >= 20 and set(ordinary) == {wire}, (wire, sorted(set(ordinary)))
