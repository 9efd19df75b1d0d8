"""Calibration (netsense calibrate) and the penalties profile tta reads: the interpolation, the file's checks
(each naming spec.compression.penalties), the race's successive halving on made-up loss curves, and one
calibration end to end on the simulated clock, whose profile a tta job then runs with."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import yaml

from netsense.bench import calibration
from netsense.control.penalties import Penalties, cost_seconds, interpolate, load, parse
from netsense.control.tta import TimeToAccuracyController
from netsense.spec import SpecError, load_job, parse_job
from netsense.spec.job import check_cluster

# ---- the interpolation ------------------------------------------------------------------------------------------

MEASURED = {0.01: 1.4, 0.003: 1.9, 0.001: 3.0}


def test_the_measured_factors_come_back_exactly_at_their_densities():
    for density, factor in MEASURED.items():
        assert interpolate(MEASURED, density) == pytest.approx(factor)


def test_between_two_measured_densities_the_factor_is_monotone_and_linear_in_log_log():
    grid = [0.01 * (0.001 / 0.01) ** (i / 50) for i in range(51)]  # 1% down to 0.1%
    values = [interpolate(MEASURED, d) for d in grid]
    assert all(b >= a for a, b in zip(values, values[1:], strict=False))
    # halfway in log density between 0.01 and 0.003: the geometric mean of their factors
    assert interpolate(MEASURED, math.sqrt(0.01 * 0.003)) == pytest.approx(math.sqrt(1.4 * 1.9))


def test_below_the_measured_densities_the_slope_goes_on_above_them_the_least_compressed_factor_holds():
    # more density than measured: never priced as nearly free (extrapolated, 1% at 1.4x reached 1 by 10%)
    assert interpolate(MEASURED, 0.03) == pytest.approx(1.4)
    assert interpolate(MEASURED, 1.0) == pytest.approx(1.4)
    assert interpolate({0.01: 0.8, 0.001: 2.0}, 0.1) == 1.0  # and never below 1
    low_slope = math.log(3.0 / 1.9) / math.log(0.001 / 0.003)
    assert interpolate(MEASURED, 0.0005) == pytest.approx(3.0 * 0.5 ** low_slope)
    assert interpolate({4.0: 0.9}, 2.0) == 1.0 and interpolate({4.0: 1.2}, 64.0) == pytest.approx(1.2)


def test_tta_prices_its_options_with_the_profile_and_not_its_priors():
    profile = Penalties(topk=dict(MEASURED), powersgd={2: 1.5, 8: 1.1})
    tta = TimeToAccuracyController(1_000_000, 2, knee=0.5, lowrank_knee=50.0, penalties=profile)
    assert tta.steps_factor(0.003) == pytest.approx(1.9)
    assert tta.lowrank_steps_factor(8) == pytest.approx(1.1)
    assert tta.lowrank_steps_factor(4) == pytest.approx(math.sqrt(1.5 * 1.1))
    # d*: the least predicted cost of the grid's densities, under the measured factors
    tta.compute_s = 0.01
    tta.sensor.observe(1_000_000, 0.08)  # 12.5 MB/s: 100 Mbit
    best = tta.sparse_density()
    from netsense.control.decision import Decision

    def cost(d: float) -> float:
        return tta.steps_factor(d) * tta.step_seconds(Decision(density=d, dense=False))

    assert tta.min_density <= best <= 1
    assert all(cost(best) <= cost(d) for d in (0.001, 0.003, 0.01, 0.03, 0.1, 1.0))


# ---- the file and the spec --------------------------------------------------------------------------------------

GOOD = {"netsense_penalties": 1, "cost": {"wall_seconds": 10.0, "steps": 100},
        "topk": {"0.01": {"steps_factor": 1.4}}, "powersgd": {"2": {"steps_factor": 1.2}}}


def _job(tmp_path, penalties: str, **compression) -> str:
    job = {"apiVersion": "netsense.dev/v1alpha1", "kind": "NetSenseJob", "metadata": {"name": "j"},
           "spec": {"workers": 2, "training": {"model": "mlp", "dataset": "synthetic", "maxSteps": 5},
                    "compression": {"method": "tta", "penalties": penalties, **compression}}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return str(path)


def test_a_penalties_file_is_read_relative_to_the_job_file(tmp_path, monkeypatch):
    (tmp_path / "p.json").write_text(json.dumps(GOOD))
    monkeypatch.chdir("/")
    job = load_job(_job(tmp_path, "p.json"))
    assert job.compression["penalties"] == str(tmp_path / "p.json")
    loaded = load(job.compression["penalties"])
    assert loaded.topk == {0.01: 1.4} and loaded.powersgd == {2: 1.2} and loaded.cost["steps"] == 100


@pytest.mark.parametrize(("content", "why"), [
    (None, "cannot read"),
    ("{not json", "is not JSON"),
    (json.dumps({"topk": {}}), "not a penalties profile"),
    (json.dumps({**GOOD, "powersgd": {}}), "no measured powersgd options"),
    (json.dumps({**GOOD, "topk": {"2": {"steps_factor": 1.1}}}), "topk.2: not a density"),
    (json.dumps({**GOOD, "topk": {"0.01": {"steps_factor": -1}}}), "steps_factor: -1 is not a positive number"),
    (json.dumps({**GOOD, "topk": {"0.01": {}}}), "needs a numeric option and a steps_factor"),
])
def test_a_bad_penalties_file_is_refused_naming_the_field(tmp_path, content, why):
    if content is not None:
        (tmp_path / "p.json").write_text(content)
    with pytest.raises(SpecError) as e:
        load_job(_job(tmp_path, "p.json"))
    assert str(e.value).startswith("spec.compression.penalties: ") and why in str(e.value), str(e.value)


def test_penalties_are_refused_on_a_cluster(tmp_path):
    (tmp_path / "p.json").write_text(json.dumps(GOOD))
    with pytest.raises(SpecError, match="spec.compression.penalties: a penalties file is read locally"):
        check_cluster(load_job(_job(tmp_path, "p.json")))


@pytest.mark.parametrize(("flag", "value", "why"), [("--densities", "0.01,2", "each must be in (0, 1]"),
                                                     ("--ranks", "2,x", "not a comma-separated list of ints")])
def test_calibrate_refuses_bad_options_naming_them_before_it_runs_anything(tmp_path, capsys, flag, value, why):
    from netsense.cli import main

    (tmp_path / "p.json").write_text(json.dumps(GOOD))
    out = tmp_path / "out"
    assert main(["calibrate", _job(tmp_path, "p.json"), "--out", str(out), flag, value]) == 2
    err = capsys.readouterr().err
    assert f"netsense: {flag}: " in err and why in err and not out.exists(), err


# ---- a cluster's profile: configmap:NAME, and the calibrate mode ------------------------------------------------

def test_a_configmap_profile_is_a_clusters_and_refused_locally_naming_the_field(tmp_path):
    from netsense.spec import check_local

    job = load_job(_job(tmp_path, "configmap:quick-penalties"))
    assert job.compression["penalties"] == "configmap:quick-penalties"  # not a path: nothing resolved or read
    check_cluster(job)
    with pytest.raises(SpecError) as e:
        check_local(job)
    assert str(e.value).startswith("spec.compression.penalties: configmap:quick-penalties names a cluster's "
                                   "ConfigMap; locally give the file"), str(e.value)


@pytest.mark.parametrize("ref", ["configmap:Quick", "configmap:", "configmap:a_b", "configmap:" + "a" * 254])
def test_a_configmap_profile_needs_a_configmaps_name(tmp_path, ref):
    with pytest.raises(SpecError) as e:
        load_job(_job(tmp_path, ref))
    assert str(e.value).startswith("spec.compression.penalties: ") and "names a ConfigMap" in str(e.value)


def _calibrate_job(tmp_path, **spec) -> str:
    job = {"apiVersion": "netsense.dev/v1alpha1", "kind": "NetSenseJob", "metadata": {"name": "j"},
           "spec": {"mode": "calibrate", "workers": 2, "training": {"model": "mlp", "dataset": "synthetic"},
                    "compression": {"method": "tta", "penalties": "configmap:old"}, **spec}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return str(path)


def test_the_calibrate_mode_is_one_schema_with_the_calibrations_settings():
    doc = {"apiVersion": "netsense.dev/v1alpha1", "kind": "NetSenseJob", "metadata": {"name": "j"}, "spec": {}}
    plain = parse_job(doc)
    assert plain.mode == "train" and plain.pods == 2 and "calibration" not in plain.spec  # nothing added
    job = parse_job({**doc, "spec": {"mode": "calibrate", "workers": 4, "calibration": {"seeds": 3}}})
    assert job.mode == "calibrate" and job.pods == 1 and job.workers == 4
    assert job.spec["calibration"] == {"seeds": 3, "steps": 200, "rungs": 3, "densities": [0.01, 0.003, 0.001],
                                       "ranks": [2, 8], "parallel": 2}
    for spec, field, why in [({"mode": "calib"}, "spec.mode", "unknown value 'calib'"),
                             ({"calibration": {"seeds": 9}}, "spec.calibration.seeds", ""),
                             ({"calibration": {"densities": [0.01, 2]}}, "spec.calibration.densities", ""),
                             ({"calibration": {"ranks": []}}, "spec.calibration.ranks", "")]:
        with pytest.raises(SpecError) as e:
            parse_job({**doc, "spec": spec})
        assert str(e.value).startswith(field) and why in str(e.value), str(e.value)


def test_a_calibrate_job_is_netsense_calibrates_locally_and_its_network_and_penalties_are_not_a_clusters_concern(
        tmp_path, capsys):
    from netsense.cli import main

    path = _calibrate_job(tmp_path, network={"clock": "simulated", "profile": {"type": "static", "rate": "1Gbit"}})
    assert main(["run", path]) == 2
    assert "spec.mode: calibrate: netsense calibrate JOB races the options locally" in capsys.readouterr().err
    check_cluster(load_job(path))  # its runs are simulated with their own link: nothing of its network is refused


def test_calibrate_reads_its_settings_from_the_spec_and_says_a_failure_in_the_termination_log(tmp_path, capsys,
                                                                                             monkeypatch):
    """The flags' defaults are spec.calibration's; what fails before or during the race is the termination
    message (a cluster's job's reason), and a configmap: reference is no concern of a calibration."""
    from netsense.cli import main

    seen = {}

    def race(job, out, **options):
        seen.update(options, penalties=job.compression.get("penalties"))
        raise RuntimeError("calibration run dense-s0-b20 failed: boom")

    monkeypatch.setattr(calibration, "calibrate", race)
    log = tmp_path / "termination-log"
    path = _calibrate_job(tmp_path, calibration={"seeds": 1, "steps": 20, "densities": [0.02], "ranks": [4]})
    assert main(["calibrate", path, "--out", str(tmp_path / "out"), "--ranks", "1,2", "--termination-log",
                 str(log)]) != 0
    assert seen == {"seeds": [0], "budget": 20, "rungs": 3, "parallel": 2, "densities": (0.02,), "ranks": (1, 2),
                    "penalties": None}
    assert log.read_text() == "calibration failed: calibration run dense-s0-b20 failed: boom"
    assert main(["calibrate", path, "--seeds", "0", "--termination-log", str(log)]) == 2
    assert log.read_text().startswith("calibration failed: --seeds/--steps/--rungs/--parallel: at least 1 seed")


def test_the_profile_leaves_a_pod_as_one_line_within_a_termination_message_or_not_at_all(tmp_path):
    entry = {"steps_factor": 12.3456, "interval": [1.2345, 123.4567], "steps": {str(s): 12345 for s in range(8)},
             "budget": 25600}
    largest = {"netsense_penalties": 1, "job": "j" * 50, "model": "resnet18", "dataset": "cifar100",
               "milestone": {"loss": 1.23456, "smoothing": "trailing mean of 10000 steps", "set_at_step": 80000,
                             "dense_steps": {str(s): 123456 for s in range(8)}},
               "seeds": list(range(8)), "cost": {"wall_seconds": 123456.7, "steps": 12345678, "runs": 96,
                                                  "train_seconds": 1234567.8, "clock": "simulated"},
               "topk": {f"{d:g}": dict(entry, lower_bound=True, budget_bound=1.2) for d in (0.1, 0.03, 0.01, 0.003,
                                                                                            0.001, 0.0003)},
               "powersgd": {str(r): dict(entry) for r in (1, 2, 4, 8, 16, 64)}}  # spec.calibration's most
    text = calibration.message(largest)
    assert json.loads(text) == largest and len(text.encode()) <= calibration.MESSAGE_LIMIT
    with pytest.raises(ValueError, match=r"over a termination message's 4096: fewer seeds, densities or ranks"):
        calibration.message({**largest, "job": "j" * 2000})
    calibration.write_message(str(tmp_path / "m"), "x" * 5000)
    assert (tmp_path / "m").read_bytes() == b"x" * 4093 + b"..."


def test_a_profiles_cost_is_its_runs_training_seconds_and_an_older_profiles_its_wall_seconds_named_as_such():
    """Issue 66: what a comparison charges a run that used the profile (netsense.bench.stats)."""
    new = {**GOOD, "cost": {"wall_seconds": 212.4, "steps": 3880, "runs": 16, "train_seconds": 41.3,
                            "clock": "simulated"}}
    assert cost_seconds(parse(new).cost) == (41.3, "simulated")
    assert cost_seconds({"train_seconds": 7, "clock": "real"}) == (7.0, "real")
    old = parse(GOOD)  # written before train_seconds: read as it is, charged its wall seconds on the clock "wall"
    assert old.cost == {"wall_seconds": 10.0, "steps": 100} and cost_seconds(old.cost) == (10.0, "wall")
    for none in (None, {}, {"steps": 100}, {"wall_seconds": "soon"}, {"train_seconds": -1.0}):
        assert cost_seconds(none) == (None, "unrecorded")


# ---- the race ---------------------------------------------------------------------------------------------------

def test_the_smoothed_loss_waits_for_its_window_and_the_milestone_is_its_first_crossing():
    curve = calibration.smoothed([4.0, 2.0, 3.0, 1.0, 0.0], 2)
    assert curve == [None, 3.0, 2.5, 2.0, 0.5]
    assert calibration.steps_to(curve, 2.5) == 3 and calibration.steps_to(curve, 0.1) is None


def test_successive_halving_gives_the_nearer_half_a_doubled_budget_and_reports_the_rest_as_lower_bounds(tmp_path,
                                                                                                         monkeypatch):
    """Made-up loss curves (loss = 1 / (1 + step / tau), tau per option and seed) stand in for the runs."""
    taus = {"dense": 10, "topk 0.01": 12, "topk 0.003": 20, "topk 0.001": 60, "powersgd 2": 11, "powersgd 8": 40}
    ran = []

    def fake_run(self, c, seed, budget):
        tau = taus[f"{c.family} {c.option}".strip()] * (1 + 0.05 * seed)
        c.losses[seed], c.tried[seed] = [1 / (1 + step / tau) for step in range(1, budget + 1)], budget
        self.runs, self.steps_trained = self.runs + 1, self.steps_trained + budget
        self.train_seconds += 0.01 * budget  # a run's training seconds on its clock: 10 ms a step here
        ran.append((c.label, seed, budget))

    monkeypatch.setattr(calibration.Race, "_run", fake_run)
    job = parse_job({"apiVersion": "netsense.dev/v1alpha1", "kind": "NetSenseJob", "metadata": {"name": "j"},
                     "spec": {"training": {"model": "mlp"}}})
    race = calibration.Race(job, str(tmp_path), seeds=[0, 1], budget=50, rungs=2, parallel=1)
    profile = race.run()
    assert sorted({b for _, _, b in ran}) == [50, 100]
    # rung 0: every option, every seed; rung 1 (100 steps): the nearer half of the three that missed
    assert sorted(label for label, _, b in ran if b == 100) == ["powersgd rank 8"] * 2 + ["topk 0.003"] * 2
    assert profile["cost"]["steps"] == 12 * 50 + 4 * 100 and profile["cost"]["runs"] == 16
    # the runs' training seconds, summed, on the clock every calibration run trains on (wall seconds kept beside)
    assert profile["cost"]["train_seconds"] == pytest.approx(0.01 * (12 * 50 + 4 * 100))
    assert profile["cost"]["clock"] == "simulated" and "wall_seconds" in profile["cost"]
    # the milestone: dense's smoothed loss at step 40 (80% of 50), the higher seed's (seed 1, the slower)
    assert profile["milestone"]["dense_steps"] == {"0": 39, "1": 40}
    assert profile["topk"]["0.01"]["steps_factor"] == pytest.approx(math.sqrt(46 / 39 * 48 / 40), abs=1e-4)
    assert profile["topk"]["0.003"]["steps"] == {"0": 75, "1": 78} and profile["topk"]["0.003"]["budget"] == 100
    assert "lower_bound" not in profile["topk"]["0.003"]
    missed = profile["powersgd"]["8"]  # promoted, and still short at the last rung: a lower bound at its budget
    assert missed["lower_bound"] and missed["steps_factor"] == pytest.approx(math.sqrt(100 / 39 * 100 / 40), abs=1e-4)
    left = profile["topk"]["0.001"]  # left behind at 50 steps: at least 50 / 40, and no less than 0.003's factor
    assert left["lower_bound"] and left["interval"] is None and left["budget"] == 50
    assert left["budget_bound"] == pytest.approx(math.sqrt(50 / 39 * 50 / 40), abs=1e-4) and left["steps_factor"] == profile["topk"]["0.003"][
        "steps_factor"]
    assert parse(profile).topk_factor(0.001) >= parse(profile).topk_factor(0.003)
    low, high = profile["powersgd"]["2"]["interval"]
    assert low <= profile["powersgd"]["2"]["steps_factor"] <= high


# ---- end to end -------------------------------------------------------------------------------------------------

TINY = {"workers": 2, "training": {"model": "mlp", "hiddenSize": 64, "dataset": "digits", "batchSize": 32,
                                   "maxSteps": 40, "evalEvery": 20, "targetAccuracy": 0.5}}


@pytest.mark.slow
@pytest.mark.gloo
def test_calibrate_writes_every_option_and_a_tta_job_runs_with_the_profile(tmp_path):
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    job = {"apiVersion": "netsense.dev/v1alpha1", "kind": "NetSenseJob", "metadata": {"name": "tiny"},
           "spec": {**TINY, "compression": {"method": "tta"}}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    out = tmp_path / "cal"
    done = subprocess.run([sys.executable, "-m", "netsense", "calibrate", str(tmp_path / "job.yaml"), "--out",
                           str(out), "--steps", "30", "--rungs", "2"], capture_output=True, text=True, timeout=240,
                          env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    profile = json.loads((out / "penalties.json").read_text())
    assert set(profile["topk"]) == {"0.01", "0.003", "0.001"} and set(profile["powersgd"]) == {"2", "8"}
    assert profile["seeds"] == [0, 1] and profile["cost"]["runs"] >= 12 and profile["cost"]["steps"] >= 12 * 30
    assert profile["cost"]["clock"] == "simulated" and profile["cost"]["train_seconds"] > 0
    assert all(e["steps_factor"] > 0 for family in ("topk", "powersgd") for e in profile[family].values())
    assert "cost:" in done.stdout and "topk density 0.01:" in done.stdout

    tta = {**job, "spec": {**job["spec"], "compression": {"method": "tta", "lowRanks": [2, 8],
                                                          "penalties": "cal/penalties.json"},
                           "network": {"clock": "simulated", "profile": {"type": "static", "rate": "50Mbit"},
                                       "simulation": calibration.SIMULATION}}}
    (tmp_path / "tta.yaml").write_text(yaml.safe_dump(tta))
    done = subprocess.run([sys.executable, "-m", "netsense", "run", str(tmp_path / "tta.yaml"), "--out",
                           str(tmp_path / "tta"), "--quiet"], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "tta" / "result.json").read_text())
    loaded = result["penalties"]
    assert loaded["file"] == str(out / "penalties.json") and loaded["cost"] == profile["cost"]
    assert loaded["topk"] == {k: v["steps_factor"] for k, v in profile["topk"].items()}
    assert loaded["powersgd"] == {k: v["steps_factor"] for k, v in profile["powersgd"].items()}
