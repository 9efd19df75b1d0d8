"""The simulated clock (netsense.clock.simulated): its model of a step, checked against the formulas it states,
and a run on it end to end: deterministic, the profile on its time axis, the controller reading its rates."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest
import torch
import yaml

from netsense.clock.devices import INPUTS
from netsense.clock.simulated import (
    FORWARD_SHARE,
    FRAMING,
    UNSHAPED_BPS,
    Collective,
    ModeledTimer,
    SimulatedClock,
    collective_seconds,
    ring_crossings,
    schedule,
)
from netsense.compression.steps import StepCounts
from netsense.emulation.cross import flows_from_spec
from netsense.shaping.profiles import build_profile
from netsense.spec import SpecError, parse_spec
from netsense.spec.job import check_cluster

# ---- one collective, one step ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "world", "hops"), [("all_reduce", 2, 2), ("all_reduce", 4, 6), ("all_gather", 4, 3),
                                                     ("all_gather", 8, 7)])
def test_a_collective_costs_its_ring_hops_latency_and_its_wire_bytes_at_the_rate(kind, world, hops):
    wire, bps, hop = 1_000_000, 100e6, 0.001
    assert collective_seconds(kind, wire, world, bps, hop) == pytest.approx(hops * hop + wire * FRAMING * 8 / bps)
    assert collective_seconds(kind, wire, 1, bps, hop) == 0.0  # one rank sends nothing


def test_an_unknown_collective_has_no_model():
    with pytest.raises(ValueError, match="no model for collective 'broadcast'"):
        collective_seconds("broadcast", 1, 2, 1e6, 0.0)


def test_collectives_overlap_the_backward_pass_as_their_buckets_allow():
    """Two buckets, each ready during backward; the link serves them in turn: what fits before the host is done
    is hidden, the rest is the step's wait."""
    compute = 0.3  # forward 0.1, backward 0.2: bucket 0 ready at 0.2, bucket 1 at 0.3
    quick = schedule([Collective("all_reduce", 0, False)] * 2, compute, 0.0, [0.05, 0.05])
    assert quick.seconds == pytest.approx(0.35) and quick.busy == pytest.approx(0.1)
    assert quick.exposed == pytest.approx(0.05)  # the last bucket's collective, after the backward pass
    slow = schedule([Collective("all_reduce", 0, False)] * 2, compute, 0.0, [0.5, 0.5])
    assert slow.seconds == pytest.approx(0.2 + 1.0)  # the link, busy from the first bucket on
    assert slow.busy == pytest.approx(1.0) and slow.exposed == pytest.approx(0.9)
    assert FORWARD_SHARE == pytest.approx(1 / 3)


def test_the_last_steps_agreement_holds_the_link_first_and_the_first_bucket_waits_for_it():
    """A controller's per-step agreement, launched when the last step ended, runs beside the forward pass: hidden
    when it is done by the first bucket, else the host and the link wait for it; never the step's own busy time."""
    compute = 0.3  # buckets ready at 0.2 and 0.3
    agreement, bucket = Collective("all_reduce", 72, False, carried=True), Collective("all_reduce", 0, False)
    hidden = schedule([agreement, bucket, bucket], compute, 0.0, [0.1, 0.05, 0.05])
    assert hidden.seconds == pytest.approx(0.35) and hidden.busy == pytest.approx(0.1)  # as without it
    late = schedule([agreement, bucket, bucket], compute, 0.0, [0.5, 0.05, 0.05])
    # the first bucket's hook waits until 0.5 (0.3 late), so the backward's rest ends at 0.6; link: 0.55, 0.65
    assert late.seconds == pytest.approx(0.65) and late.busy == pytest.approx(0.1)


def _carried_per_step(rank: int, world: int, method: dict) -> list[list[tuple[str, float]]]:
    """Each step's carried collectives (kind, wire bytes) as the hook tells a simulated clock, over 4 steps."""
    import torch.nn.functional as F
    from support.ranks import batch, in_ddp, tiny_mlp

    from netsense.compression import register

    clock = SimulatedClock(None, world, compute_s=0.01, compression_s_per_melement=0.0, latency_s=1e-4)
    model = in_ddp(tiny_mlp(), method)
    state = register(model, method, clock=clock)
    carried = []
    for step in range(4):
        state.start_step()
        x, y = batch(rank, step)
        F.cross_entropy(model(x), y).backward()
        state.end_step()
        carried.append([(c.kind, c.wire_bytes) for c in state.timer.collectives if c.carried])
    state.finish()
    return carried


@pytest.mark.gloo
def test_a_controller_pays_its_steps_agreement_and_a_fixed_method_sends_none():
    """tta reads each step's agreed measurement: from the second step on, the last step's agreement (a ring
    all_reduce of the measurement's float64s) is priced in the step. TopK at a fixed density reads nothing: the
    ranks send no agreement at all (it used to be sent every step and ignored)."""
    from support.ranks import run_world

    from netsense.compression.hooks import MEASURED

    tta = run_world(_carried_per_step, 2, {"method": "tta"})[0]
    assert tta[0] == [] and all(step == [("all_reduce", 8 * len(MEASURED))] for step in tta[1:])
    topk = run_world(_carried_per_step, 2, {"method": "topk", "density": 0.1})[0]
    assert topk == [[]] * 4


def test_a_collective_the_host_waits_for_stalls_the_rest_of_the_step():
    """PowerSGD's first all_reduce (blocking) then its second (async), one bucket: the host waits for the first."""
    compute = 0.3
    step = schedule([Collective("all_reduce", 0, True), Collective("all_reduce", 0, False)], compute, 0.0, [0.1, 0.1])
    # first: ready 0.2, done 0.3 (the host stalls 0.1); second: ready 0.3 + 0.1, done 0.5; host done at 0.4
    assert step.seconds == pytest.approx(0.5) and step.busy == pytest.approx(0.2)


def _settle(clock: SimulatedClock, wire_bytes: float, sparse: float = 0.0, lowrank: float = 0.0) -> float:
    before = clock.now()
    timer = ModeledTimer()
    timer.start("all_reduce", wire_bytes)
    counts = StepCounts(elements_total=max(1e6, sparse + lowrank), sparse_elements=sparse, lowrank_elements=lowrank)
    cost = clock.settle(before, timer, ModeledTimer(), counts)
    assert cost.compute_seconds == clock.compute_s
    return clock.now() - before


def test_the_clock_advances_by_the_model_and_a_rate_change_lands_at_its_simulated_time():
    profile = build_profile({"type": "steps", "steps": [{"at": "0s", "rate": "80Mbit"}, {"at": "1s", "rate": "8Mbit"}]})
    clock = SimulatedClock(profile, world=2, compute_s=0.01, compression_s_per_melement=0.0, latency_s=0.0)
    wire = 1_000_000 / FRAMING  # 0.1 s at 80 Mbit, 1 s at 8
    steps = []
    while clock.now() < 3:
        steps.append((clock.now(), _settle(clock, wire)))
    fast = [s for t, s in steps if t < 1]
    slow = [s for t, s in steps if t >= 1]
    # bucket ready at 0.01: 0.01 + 0.1 a step, until the first step that starts at or after 1 s
    assert fast == pytest.approx([0.11] * len(fast)) and len(fast) == 10
    assert slow == pytest.approx([1.01] * len(slow))


def test_a_compressed_step_pays_each_paths_work_per_element():
    clock = SimulatedClock(None, world=2, compute_s=0.01, compression_s_per_melement=0.02, latency_s=0.0,
                           lowrank_s_per_melement=0.05)
    dense, sparse = _settle(clock, 0), _settle(clock, 0, sparse=3e6)
    assert sparse - dense == pytest.approx(0.06)
    assert _settle(clock, 0, sparse=1e6, lowrank=2e6) - dense == pytest.approx(0.02 + 0.1)  # tta: a bucket each
    # a device profile's TopK figure prices PowerSGD's path where no figure of its own is given
    same = SimulatedClock(None, world=2, compute_s=0.01, compression_s_per_melement=0.02, latency_s=0.0)
    assert _settle(same, 0, lowrank=3e6) - dense == pytest.approx(0.06)


def test_calibration_times_each_paths_own_work_on_the_models_gradient():
    """The hook's own local work, per path (calibrate.path_seconds): TopK's decodes every rank's chunk, so more
    ranks cost it more; PowerSGD's projections grow with the rank; both are per million elements."""
    from netsense.train import calibrate

    torch.manual_seed(0)
    params = list(torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 10)).parameters())
    settings = calibrate.path_settings({"method": "powersgd", "rank": 1, "values": "fp32"})
    assert settings == {"fp16": False, "errorFeedback": True, "density": 0.01, "rank": 1}
    assert calibrate.path_settings({"method": "tta", "lowRanks": [2, 8]})["rank"] == 8
    assert calibrate.path_settings({"method": "topk", "density": 0.2})["density"] == 0.2
    sparse, _ = calibrate.path_seconds(params, settings, world=2)
    _, lowrank = calibrate.path_seconds(params, {**settings, "rank": 8}, world=2)  # rank 1's work is near a copy's
    assert sparse > 0 and lowrank > 0
    # TopK at density 1 packs every element and decodes 8 full chunks: several times the 1% path's work (whose
    # selection reads every element too), measured ~3x on a quiet machine; 1.5x leaves room for a loaded one
    dense_topk, _ = calibrate.path_seconds(params, {**settings, "density": 1.0}, world=8)
    assert dense_topk > 1.5 * sparse


def test_jitter_is_the_same_on_every_rank_and_every_rerun_and_differs_between_collectives():
    def durations(seed: int) -> list[float]:
        clock = SimulatedClock(None, 2, 0.01, 0.0, 0.0, jitter=0.2, seed=seed)
        return clock.durations([Collective("all_reduce", 1e6, False)] * 4, 1e8)

    assert durations(1) == durations(1)
    assert len(set(durations(1))) == 4 and durations(1) != durations(2)
    assert all(d >= 0 for d in durations(3))


# ---- the shared topology -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("world", "procs", "crossings"), [(2, 1, 1), (3, 1, 1), (4, 1, 2), (5, 1, 2), (8, 1, 4),
                                                           (64, 1, 32), (4, 2, 1), (8, 2, 2), (2, 2, 0)])
def test_a_ring_crosses_the_shared_link_once_each_way_per_pair_of_racks_it_alternates(world, procs, crossings):
    """Hops r -> r+1 from rack A (even workers) to rack B; 3 ranks: 0->1 crosses, 1->2 crosses back, 2->0 joins
    two even ranks. Two processes a worker (4 ranks): 1->2 and 3->0 cross, 0->1 and 2->3 stay in a worker."""
    assert ring_crossings(world, procs) == crossings


def _shared(world: int, cross: list[dict] | None = None, rate: str = "10Mbit", procs: int = 1) -> SimulatedClock:
    profile = build_profile({"type": "static", "rate": rate})
    return SimulatedClock(profile, world=world, compute_s=0.0, compression_s_per_melement=0.0, latency_s=0.001,
                          topology="shared", cross=flows_from_spec([{"flows": 1, **c} for c in cross or []]),
                          procs_per_worker=procs)


# (world, cross flows active, flows in the A -> B direction): wire 1 MB (after framing) = 0.8 s alone at 10 Mbit
@pytest.mark.parametrize(("world", "cross", "flows"), [(2, 0, 1), (4, 0, 2), (8, 0, 4), (3, 0, 1), (5, 0, 2),
                                                       (2, 2, 3), (4, 1, 3), (8, 3, 7), (3, 1, 2)])
def test_a_collective_on_the_shared_link_runs_at_its_fair_share_of_the_busiest_direction(world, cross, flows):
    """By hand: all_reduce, 2(p-1) hops of 1 ms, plus 1 MB at 10 Mbit / flows (p/2 ring flows a direction, (p-1)/2
    for odd p, and the bulk cross flows, all A -> B)."""
    clock = _shared(world, [{"type": "bulk", "flows": cross}] if cross else None)
    wire = 1_000_000 / FRAMING
    [seconds] = clock.durations([Collective("all_reduce", wire, False)], clock.bps_at(0), clock.flows_at(0))
    by_hand = {(2, 0): 0.002 + 0.8, (4, 0): 0.006 + 1.6, (8, 0): 0.014 + 3.2, (3, 0): 0.004 + 0.8,
               (5, 0): 0.008 + 1.6, (2, 2): 0.002 + 2.4, (4, 1): 0.006 + 2.4, (8, 3): 0.014 + 5.6,
               (3, 1): 0.004 + 1.6}[(world, cross)]
    assert clock.flows_at(0) == flows
    assert seconds == pytest.approx(by_hand)
    assert _settle(clock, wire) == pytest.approx(by_hand)  # the step: compute 0, its one collective


def test_two_workers_on_the_shared_link_cost_what_a_per_host_link_costs():
    """One ring flow each way: the per-host formula, to the bit."""
    per_host = SimulatedClock(build_profile({"type": "static", "rate": "10Mbit"}), 2, 0.0, 0.0, 0.001)
    assert per_host.flows_at(0) == 1
    shared = _shared(2)
    collectives = [Collective("all_reduce", 1e6, False), Collective("all_gather", 3e5, False)]
    assert shared.durations(collectives, 1e7, shared.flows_at(0)) == per_host.durations(collectives, 1e7)
    # more workers on a per-host link: still one flow a link (the formula of today)
    assert SimulatedClock(None, 8, 0.0, 0.0, 0.0).flows_at(5.0) == 1


def test_cross_traffic_counts_while_it_runs_on_the_training_clock():
    """A bulk flow from 2 s to 4 s and an onoff flow (on 1 s, off 2 s from 0.5 s): each counted at the step's start
    only while on; 4 workers add 2 ring flows A -> B."""
    clock = _shared(4, [{"type": "bulk", "start": "2s", "stop": "4s"},
                        {"type": "onoff", "start": "0.5s", "onFor": "1s", "offFor": "2s", "flows": 2}])
    expected = {0.0: 2, 0.5: 4, 1.4: 4, 1.5: 2, 2.0: 3, 3.4: 3, 3.5: 5, 4.0: 4, 4.5: 2, 6.5: 4}
    assert {t: clock.flows_at(t) for t in expected} == expected
    # the step starting in the on-period pays for it; one starting in the off-period does not
    wire = 1_000_000 / FRAMING  # 0.8 s alone at 10 Mbit
    clock.t = 0.5
    assert _settle(clock, wire) == pytest.approx(0.006 + 0.8 * 4)
    clock.t = 1.5
    assert _settle(clock, wire) == pytest.approx(0.006 + 0.8 * 2)


def test_a_ring_that_never_crosses_the_shared_link_is_not_priced_on_it():
    """One worker of two processes: its collectives stay inside the worker, whatever crosses the link."""
    clock = _shared(2, [{"type": "bulk"}], procs=2)
    assert clock.flows_at(0) == 0
    [seconds] = clock.durations([Collective("all_reduce", 1e6, False)], clock.bps_at(0), clock.flows_at(0))
    assert seconds == pytest.approx(0.002 + 1e6 * FRAMING * 8 / UNSHAPED_BPS)


def test_the_clock_refuses_what_it_cannot_model():
    with pytest.raises(ValueError, match="no model for topology 'star'"):
        SimulatedClock(None, 2, 0.0, 0.0, 0.0, topology="star")
    with pytest.raises(ValueError, match="cross traffic needs the shared topology"):
        SimulatedClock(None, 2, 0.0, 0.0, 0.0, cross=flows_from_spec([{"type": "bulk", "flows": 1}]))


# ---- the spec ---------------------------------------------------------------------------------------------------

BASE = {"workers": 2, "training": {"model": "mlp", "dataset": "synthetic", "maxSteps": 5}}


@pytest.mark.parametrize(("network", "field", "why"), [
    ({"clock": "simulated", "simulation": {"computeSeconds": -1}}, "spec.network.simulation.computeSeconds", "> 0"),
    ({"clock": "simulated", "simulation": {"computeSeconds": 0}}, "spec.network.simulation.computeSeconds", "> 0"),
    ({"clock": "simulated", "simulation": {"jitter": 2}}, "spec.network.simulation.jitter", "<= 1"),
    ({"clock": "simulated", "simulation": {"latency": 5}}, "spec.network.simulation.latency", "unit"),
    ({"clock": "simulated", "simulation": {"device": "h100"}}, "spec.network.simulation.device", "unknown"),
    ({"simulation": {"computeSeconds": 0.1}}, "spec.network.simulation", "needs clock: simulated"),
    ({"clock": "sim"}, "spec.network.clock", "real"),
    ({"clock": "simulated", "profile": {"type": "static", "rate": "1Gbit", "loss": "1%"}}, "spec.network.profile",
     "no loss"),
    ({"clock": "simulated", "topology": "shared", "profile": {"type": "static", "rate": "1Gbit", "jitter": "1ms"}},
     "spec.network.profile", "no loss or netem jitter"),
    ({"clock": "simulated", "topology": "shared",
      "crossTraffic": [{"type": "bulk"}, {"type": "onoff", "onFor": "1s", "offFor": "1s", "congestionControl": "bbr"}]},
     "spec.network.crossTraffic[1].congestionControl", "an equal share"),
    ({"clock": "simulated", "crossTraffic": [{"type": "bulk"}]}, "spec.network.crossTraffic", "needs topology: shared"),
])
def test_bad_simulation_settings_are_refused_naming_the_field(network, field, why):
    with pytest.raises(SpecError) as e:
        parse_spec({**BASE, "network": network}, "j")
    assert field in str(e.value) and why in str(e.value), str(e.value)


def test_the_shared_topology_and_its_cross_traffic_run_on_the_simulated_clock():
    network = {"clock": "simulated", "topology": "shared", "profile": {"type": "static", "rate": "100Mbit"},
               "crossTraffic": [{"type": "bulk", "flows": 2, "start": "5s"},
                                {"type": "onoff", "onFor": "1s", "offFor": "2s"}]}
    job = parse_spec({**BASE, "workers": 64, "network": network}, "j")
    assert job.network["topology"] == "shared" and len(job.network["crossTraffic"]) == 2


def test_more_than_one_thread_is_refused_on_the_simulated_clock():
    spec = {**BASE, "training": {**BASE["training"], "threads": 2}, "network": {"clock": "simulated"}}
    with pytest.raises(SpecError, match="spec.training.threads: the simulated clock runs one thread a worker"):
        parse_spec(spec, "j")


def test_a_device_profile_is_refused_for_a_model_batch_or_input_it_was_not_measured_on():
    for training, why in [({"model": "mlp"}, "measured for model resnet18, not mlp"),
                          ({"model": "resnet18", "batchSize": 64}, "measured at batchSize 32 a worker, not 64"),
                          ({"model": "resnet18", "dataset": "digits32"}, "measured on 3x32x32 inputs")]:
        spec = {**BASE, "training": {**BASE["training"], **training},
                "network": {"clock": "simulated", "simulation": {"device": "resnet18-b32-h200"}}}
        with pytest.raises(SpecError, match=f"spec.network.simulation.device: resnet18-b32-h200 was {why}"):
            parse_spec(spec, "j")


def test_a_device_profile_gives_a_cells_inputs_unmeasured_and_a_written_figure_wins(monkeypatch):
    from netsense.bench import run as bench_run
    from netsense.bench.grid import Cell
    from netsense.clock.devices import PROFILES, given_inputs
    from netsense.train import calibrate

    monkeypatch.setattr(calibrate, "inputs_for", lambda *a: pytest.fail("measured what the profile gives"))
    training = {**BASE["training"], "model": "resnet18"}

    def cell(simulation: dict) -> Cell:
        job = {"apiVersion": "netsense.dev/v1alpha1", "kind": "NetSenseJob", "metadata": {"name": "c"},
               "spec": {**BASE, "training": training, "network": {"clock": "simulated", "simulation": simulation}}}
        return Cell(job=job, method="m", scenario="s", seed=0)

    cells = [cell({"device": "resnet18-b32-h200"}), cell({"device": "resnet18-b32-h200", "computeSeconds": 0.1})]
    bench_run._measure_simulation_inputs(cells)  # measures nothing: the profile gives all three
    profile = PROFILES["resnet18-b32-h200"]
    given = [given_inputs(c.job["spec"]["network"]["simulation"]) for c in cells]  # what the trainer reads
    per_melement = profile.compression_seconds_per_melement  # both paths: the profile has TopK's figure alone
    assert given[0] == (profile.compute_seconds, per_melement, per_melement)
    assert profile.compute_seconds == 4.938e-3
    assert given[1] == (0.1, per_melement, per_melement)
    parse_spec(cells[0].job["spec"], "c")  # what the bench gives a cell still validates


def test_the_bench_measures_a_tasks_compute_once_and_each_compression_paths_once(monkeypatch):
    """Cells of one task share one compute measurement whatever they compress (their comparison would otherwise
    carry the measurement's noise: 35-48 ms between measurements of the same CNN step), and each path setting's own
    figures."""
    from netsense.bench import run as bench_run
    from netsense.bench.grid import Cell
    from netsense.train import calibrate

    calls = []

    def measured(training, compression, world, compute=None):
        calls.append((compression["method"], compute))
        return (0.01 if compute is None else compute, 0.002, 0.003 if compression["method"] == "powersgd" else 0.004)

    monkeypatch.setattr(calibrate, "inputs_for", measured)

    def cell(compression: dict, seed: int) -> Cell:
        job = {"apiVersion": "netsense.dev/v1alpha1", "kind": "NetSenseJob", "metadata": {"name": "c"},
               "spec": {**BASE, "compression": compression, "network": {"clock": "simulated"}}}
        return Cell(job=job, method=compression["method"], scenario="s", seed=seed)

    cells = [cell({"method": "topk", "density": 0.01}, s) for s in (0, 1)] + [cell({"method": "powersgd"}, 0)]
    bench_run._measure_simulation_inputs(cells)
    assert calls == [("topk", None), ("powersgd", 0.01)]  # the second path setting reuses the task's compute
    given = [c.job["spec"]["network"]["simulation"] for c in cells]
    assert [g["computeSeconds"] for g in given] == [0.01] * 3
    assert [g["lowRankSecondsPerMelement"] for g in given] == [0.004, 0.004, 0.003]


def test_a_cluster_refuses_the_simulated_clock():
    job = parse_spec({**BASE, "network": {"clock": "simulated"}}, "j")
    with pytest.raises(SpecError, match="spec.network.clock: simulated is a study tool"):
        check_cluster(job)


# ---- a run on it ------------------------------------------------------------------------------------------------

SIMULATED_JOB = {
    "apiVersion": "netsense.dev/v1alpha1", "kind": "NetSenseJob", "metadata": {"name": "sim"},
    "spec": {"workers": 2,
             "training": {"model": "mlp", "dataset": "synthetic", "maxSteps": 40, "batchSize": 32, "evalEvery": 20,
                          "targetAccuracy": 0.3},
             "compression": {"method": "netsense"},
             "network": {"clock": "simulated",
                         "simulation": {"computeSeconds": 0.004, "compressionSecondsPerMelement": 0.005,
                                        "lowRankSecondsPerMelement": 0.007},
                         "profile": {"type": "steps", "steps": [{"at": "0s", "rate": "200Mbit"},
                                                                {"at": "0.5s", "rate": "20Mbit"}]}}}}


def _run(tmp_path, name: str, job: dict) -> tuple[dict, list[dict]]:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job))
    out = tmp_path / name
    done = subprocess.run([sys.executable, "-m", "netsense", "run", str(path), "--out", str(out), "--quiet"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONHASHSEED": "0"})
    assert done.returncode == 0, done.stderr[-2000:]
    with open(out / "timeline.csv") as fh:
        return json.loads((out / "result.json").read_text()), list(csv.DictReader(fh))


@pytest.mark.gloo
def test_a_simulated_run_is_deterministic_follows_its_profile_and_its_controller_senses_the_modeled_rate(tmp_path):
    """Two runs of one job on the simulated clock (its measured inputs given): the same steps, times, decisions
    and accuracies, to the bit; each step at the profile's rate at its simulated time; the paper's controller's
    bandwidth estimate follows the modeled link. Needs no root: nothing is shaped."""
    first, rows = _run(tmp_path, "a", SIMULATED_JOB)
    second, rows_again = _run(tmp_path, "b", SIMULATED_JOB)
    assert rows == rows_again
    for key in ("train_seconds", "steps", "accuracy_curve", "time_to_accuracy_s", "mean_density", "final_loss"):
        assert first[key] == second[key], key
    assert first["clock"] == "simulated" and first["collective_timer"] == "modeled"
    assert first["simulation"]["measured"] == []  # both inputs given: nothing measured, nothing to vary
    # No namespace, no shaper: a simulated run is a process tree of this machine.
    assert "tcp_congestion_control" not in first
    times = [float(r["time"]) for r in rows]
    assert times == sorted(times) and first["train_seconds"] == pytest.approx(times[-1], abs=1e-3)
    for prev, row in zip(rows, rows[1:], strict=False):
        started = float(prev["time"])  # a step starts where the one before ended
        rate = 200 if started < 0.5 else 20
        assert float(row["link_rate_mbit"]) == (200 if float(row["time"]) < 0.5 else 20)
        bytes_, comm = float(row["bytes"]), float(row["comm_s"])
        # its collectives at the rate in force when it started, plus their hops' latency (0.05 ms a hop)
        hops = (comm - bytes_ * FRAMING * 8 / (rate * 1e6)) / 0.05e-3
        assert 1 <= round(hops) <= 40 and hops == pytest.approx(round(hops), abs=1e-3), (row, rate, hops)
    sensed = [(float(r["time"]), float(r["est_btlbw_mbit"])) for r in rows if r["est_btlbw_mbit"]]
    # what it senses is payload over time: the rate less the framing
    assert [est for t, est in sensed if t < 0.45][-1] == pytest.approx(200 / FRAMING, rel=0.05)
    assert sensed[-1][1] == pytest.approx(20 / FRAMING, rel=0.05), f"the controller sensed {sensed}"


def _grid(tmp_path, clock: str) -> str:
    grid = {"name": "sim", "base": {"workers": 2, "training": {"model": "mlp", "hiddenSize": 64, "dataset": "digits",
                                                               "batchSize": 32, "maxSteps": 10, "evalEvery": 5,
                                                               "targetAccuracy": 0.5},
                                    "network": {"clock": clock}},
            "methods": {"topk": {"method": "topk", "density": 0.01}},
            "profiles": {"static-20": {"type": "static", "rate": "20Mbit"}}, "seeds": [0, 1]}
    path = tmp_path / f"{clock}.yaml"
    path.write_text(yaml.safe_dump(grid))
    return str(path)


@pytest.mark.gloo
def test_bench_runs_simulated_cells_side_by_side_and_refuses_that_for_real_ones(tmp_path):
    from netsense.bench import run_bench

    with pytest.raises(SpecError, match="--parallel: 2: cells run side by side on a cluster"):
        run_bench(_grid(tmp_path, "real"), str(tmp_path / "real"), parallel=2)
    assert run_bench(_grid(tmp_path, "simulated"), str(tmp_path / "out"), parallel=2) == 0
    results = [json.loads(p.read_text()) for p in (tmp_path / "out").glob("*/result.json")]
    assert len(results) == 2 and all(r["status"] == "Succeeded" and r["clock"] == "simulated" for r in results)
    # The task's inputs measured once by the bench, before the cells ran side by side, and given to each
    compute = {tuple(r["simulation"][k] for k in INPUTS) for r in results}
    assert len(compute) == 1 and min(next(iter(compute))) > 0, compute
    assert all(r["simulation"]["measured"] == [] for r in results)

