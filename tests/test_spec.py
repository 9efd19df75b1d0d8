"""The NetSenseJob model, units and profiles (pure unit tests, no root)."""

from __future__ import annotations

import glob
import os

import pytest
import yaml
from support import REPO

from netsense import units
from netsense.shaping.profiles import build_profile
from netsense.spec import SpecError, load_job, parse_job, parse_spec
from netsense.spec.crd import crd
from netsense.spec.job import VALUES_DEFAULT


def doc(**spec):
    return {"apiVersion": "netsense.dev/v1alpha1", "kind": "NetSenseJob", "metadata": {"name": "j"}, "spec": spec}


@pytest.mark.parametrize("text, bps", [("200Mbit", 200e6), ("1Gbit", 1e9), ("500kbit", 5e5), ("1.5gbit", 1.5e9)])
def test_rates_are_bits_per_second(text, bps):
    assert units.parse_rate(text) == bps


@pytest.mark.parametrize("text, why", [("fast", "not a rate"), ("200Mbps", "ambiguous"), ("0Mbit", "greater"),
                                       (200, "string"), ("10 furlongs", "unknown rate unit")])
def test_bad_rates_say_why(text, why):
    with pytest.raises(units.UnitError, match=why):
        units.parse_rate(text)


def test_durations_and_percent():
    assert units.parse_duration("2m") == 120 and units.parse_duration("500ms") == 0.5
    assert units.parse_duration(30) == 30
    assert units.parse_fraction_or_percent("0.1%") == pytest.approx(0.001)
    assert units.format_rate(200e6) == "200Mbit" and units.format_rate(1e9) == "1Gbit"


def test_defaults_are_filled():
    job = parse_job(doc())
    assert job.workers == 2
    assert job.training["epochs"] == 1 and job.training["batchSize"] == 32
    assert job.compression == {"method": "allreduce"}  # a method's own settings only
    assert job.run_policy["backoffLimit"] == 2
    assert job.network["direction"] == "egress"


def test_every_error_is_reported_with_its_path():
    with pytest.raises(SpecError) as e:
        parse_job(doc(workers="two", training={"lr": -1, "optimizer": "lion"}, compression={"density": 0},
                      network={"profile": {"type": "steps", "from": "1Gbit"}}))
    paths = {i.path for i in e.value.issues}
    assert {"spec.workers", "spec.training.lr", "spec.training.optimizer", "spec.compression.density",
            "spec.network.profile"} <= paths


@pytest.mark.parametrize("profile, message", [
    ({"type": "warp"}, "unknown or missing type"),
    ({"type": "static"}, "required"),
    ({"type": "steps", "steps": [{"at": "5s", "rate": "1Gbit"}]}, "first step must be at 0s"),
    ({"type": "steps", "steps": [{"at": "0s", "rate": "1Gbit"}, {"at": "0s", "rate": "2Gbit"}]}, "increasing"),
    ({"type": "fluctuating", "min": "1Gbit", "max": "100Mbit"}, "must not exceed max"),
    ({"type": "trace"}, "either 'file'"),
    ({"type": "static", "rate": "1Gbit", "loss": "150%"}, "between 0% and 100%"),
])
def test_bad_profiles(profile, message):
    with pytest.raises(SpecError, match=message):
        parse_job(doc(network={"profile": profile}))


def test_step_generator_and_listed_steps():
    p = build_profile({"type": "steps", "from": "2000Mbit", "to": "200Mbit", "by": "200Mbit", "every": "60s"})
    assert [r / 1e6 for _, r in p.points] == [2000 - 200 * i for i in range(10)]
    assert p.rate_at(59.9) == 2000e6 and p.rate_at(60) == 1800e6 and p.rate_at(1e6) == 200e6
    assert p.next_change(0) == 60 and p.next_change(540) is None


def test_fluctuating_is_reproducible_from_the_seed_and_bounded():
    spec = {"type": "fluctuating", "min": "100Mbit", "max": "1Gbit", "period": "30s", "seed": 7}
    a, b = build_profile(spec), build_profile(spec)
    c = build_profile({**spec, "seed": 8})
    assert a.points[:50] == b.points[:50] != c.points[:50]
    assert all(100e6 <= r <= 1e9 for _, r in a.points)
    sine = build_profile({**spec, "shape": "sine"})
    assert max(r for _, r in sine.points) == pytest.approx(1e9, rel=1e-3)


def test_looped_trace_and_mean_rate(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("t,rate\n0,100Mbit\n10,300Mbit\n")
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc(network={"profile": {"type": "trace", "file": "trace.csv", "loop": True}})))
    job = load_job(str(path))
    assert "points" in job.network["profile"] and "file" not in job.network["profile"]
    p = build_profile(job.network["profile"])
    assert p.rate_at(25) == 100e6 and p.rate_at(35) == 300e6  # period 20 s
    assert p.mean_rate(0, 20) == pytest.approx(200e6)


def test_missing_trace_file_names_the_field(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc(network={"profile": {"type": "trace", "file": "nope.csv"}})))
    with pytest.raises(SpecError, match="spec.network.profile.file"):
        load_job(str(path))


def test_samples_validate():
    files = glob.glob(os.path.join(REPO, "samples", "*.yaml"))
    assert files
    for f in files:
        load_job(f)


def test_crd_schema_follows_the_spec_model():
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    from netsense.spec.job import COMPRESSION, SPEC, TRAINING

    assert set(schema["properties"]) == set(SPEC.fields)
    assert set(schema["properties"]["training"]["properties"]) == set(TRAINING.fields)
    comp = schema["properties"]["compression"]["properties"]
    assert set(comp) == {"method"} | {k for v in COMPRESSION.variants.values() for k in v.fields}
    assert comp["method"]["enum"] == [*COMPRESSION.variants, *COMPRESSION.aliases]
    assert comp["density"]["maximum"] == 1
    profile = schema["properties"]["network"]["properties"]["profile"]
    assert set(profile["properties"]["type"]["enum"]) == {"static", "steps", "fluctuating", "trace"}
    assert any("has(self.rate)" in r["rule"] for r in profile["x-kubernetes-validations"])


def test_manifest_crd_is_the_generated_one():
    with open(os.path.join(REPO, "manifests", "base", "crd.yaml")) as fh:
        assert yaml.safe_load(fh) == crd(), "run `make manifests` to regenerate manifests/base/crd.yaml"


@pytest.mark.parametrize("backend, device, cuda, want", [
    ("auto", "auto", False, ("gloo", "cpu")),
    ("auto", "auto", True, ("nccl", "cuda:0")),
    ("auto", "cpu", True, ("gloo", "cpu")),        # a GPU machine may still train on its CPUs
    ("gloo", "cuda", True, ("gloo", "cuda:0")),    # several ranks sharing one GPU
    ("gloo", "auto", True, ("gloo", "cpu")),
])
def test_the_backend_and_device_a_job_gets(backend, device, cuda, want):
    from netsense.train.trainer import resolve_device

    job = parse_job(doc(training={"model": "mlp", "dataset": "digits", "backend": backend, "device": device}))
    got_backend, got_device = resolve_device(job.training, cuda)
    assert (got_backend, str(got_device)) == want


@pytest.mark.parametrize("training, field", [({"device": "cuda"}, "spec.training.device"),
                                             ({"backend": "nccl"}, "spec.training.backend")])
def test_asking_for_cuda_where_there_is_none_names_the_field(training, field):
    from netsense.train.trainer import resolve_device

    job = parse_job(doc(training={"model": "mlp", "dataset": "digits", **training}))
    with pytest.raises(SpecError) as e:
        resolve_device(job.training, False)
    assert str(e.value).startswith(field + ":") and "needs a CUDA device" in str(e.value)


def test_nccl_on_cpu_tensors_is_refused_naming_the_device():
    with pytest.raises(SpecError) as e:
        parse_job(doc(training={"model": "mlp", "dataset": "digits", "backend": "nccl", "device": "cpu"}))
    assert "spec.training.device" in str(e.value) and "nccl" in str(e.value)


def test_a_setting_of_another_method_is_an_error_naming_the_field_and_its_method():
    with pytest.raises(SpecError) as e:
        parse_job(doc(compression={"method": "tta", "density": 0.01}))
    assert str(e.value).startswith("spec.compression.density: applies to method topk, not tta")
    with pytest.raises(SpecError) as e:
        parse_job(doc(compression={"method": "topk", "colour": "red"}))
    assert "spec.compression.colour: unknown field" in str(e.value)


def test_each_method_gets_its_own_defaults():
    topk = parse_job(doc(compression={"method": "topk"})).compression
    assert topk == {"method": "topk", "density": 0.1, "values": "fp16", "errorFeedback": True,
                    "momentumCorrection": True, "momentumMasking": False, "warmupSteps": 0, "selection": "exact"}
    netsense = parse_job(doc(compression={"method": "netsense"})).compression
    assert netsense["initialRatio"] == 0.01
    assert netsense["errorFeedback"] is False, "the paper's method is published without error feedback"
    assert parse_job(doc(compression={"method": "tta"})).compression["values"] == "fp16"


def test_every_method_with_a_wire_format_sends_fp16_unless_told():
    """One wire format (issue 62): topk, dc2, tta and powersgd share one default; allreduce, fp16 and netsense
    have no values field (fixed formats; netsense its own fp16 gate)."""
    assert VALUES_DEFAULT == "fp16"
    for method in ("topk", "dc2", "tta", "powersgd"):
        assert parse_job(doc(compression={"method": method})).compression["values"] == "fp16", method
        assert parse_job(doc(compression={"method": method, "values": "fp32"})).compression["values"] == "fp32"
    for method in ("allreduce", "fp16", "netsense"):
        assert "values" not in parse_job(doc(compression={"method": method})).compression, method
        with pytest.raises(SpecError, match=r"spec\.compression\.values: applies to method"):
            parse_job(doc(compression={"method": method, "values": "fp16"}))


def test_momentum_masking_without_correction_is_refused_by_name():
    with pytest.raises(SpecError, match=r"compression\.momentumMasking: needs momentumCorrection"):
        parse_job(doc(compression={"method": "tta", "momentumCorrection": False, "momentumMasking": True}))


def test_tta_settings_since_removed_are_refused_by_name_unless_at_their_old_default():
    """learnKnee, familyPilot, familyPilotExponent, convTopkPrior (issue 62, item 4): a value that would have done
    something is refused, naming the field and the last commit that had it; at its old default (what a cluster
    recorded with every default filled in) it changed nothing and is dropped."""
    from netsense.spec.job import REMOVED_AT, REMOVED_TTA

    for key, (default, _) in REMOVED_TTA.items():
        other = (not default) if isinstance(default, bool) else default * 2
        with pytest.raises(SpecError, match=rf"compression\.{key}: removed from tta \(issue 62: not adopted; .*"
                                            rf"commit {REMOVED_AT[:12]} is the last with it"):
            parse_job(doc(compression={"method": "tta", key: other}))
        assert key not in parse_job(doc(compression={"method": "tta", key: default})).compression
    assert parse_job(doc(compression={"method": "tta", "stepLaw": "power"})).compression["densityExponent"] == 0.109


def test_powersgd_steps_momentum_after_the_all_reduce_without_error_feedback_is_refused_by_name():
    """The shared momentum of tta's PowerSGD steps takes over the velocity through the residual."""
    with pytest.raises(SpecError, match=r"compression\.lowRankMomentumCorrection: false \(the default\) moves "
                                        r"each rank's velocity into its residual .* needs errorFeedback"):
        parse_job(doc(compression={"method": "tta", "lowRanks": [4], "errorFeedback": False}))
    for fine in ({"lowRankMomentumCorrection": True}, {"momentumCorrection": False}, {"lowRanks": []}):
        parse_job(doc(compression={"method": "tta", "lowRanks": [4], "errorFeedback": False, **fine}))
    for no_momentum in ({"optimizer": "adam"}, {"momentum": 0}):  # nothing to move: nothing to refuse
        parse_job(doc(training=no_momentum, compression={"method": "tta", "lowRanks": [4], "errorFeedback": False}))


def test_a_run_without_the_wire_under_torchs_fp16_hook_is_refused_by_name():
    with pytest.raises(SpecError, match=r"training\.nullWire: method fp16 runs torch's own hook"):
        parse_job(doc(training={"nullWire": True}, compression={"method": "fp16"}))
    assert parse_job(doc(training={"nullWire": True}, compression={"method": "topk"})).training["nullWire"]


@pytest.mark.parametrize("old", ["overlap", "ours"])
def test_the_controllers_old_names_still_work_with_a_warning(old):
    with pytest.warns(FutureWarning, match="'tta'"):
        job = parse_job(doc(compression={"method": old, "kneeDensity": 0.004}))
    assert job.compression["method"] == "tta" and job.compression["kneeDensity"] == 0.004


def test_the_crd_defaults_the_method_but_no_methods_settings():
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    compression = schema["compression"]
    assert compression["properties"]["method"]["default"] == "allreduce"
    assert "overlap" in compression["properties"]["method"]["enum"]  # old YAML is still admitted
    # the API server fills declared defaults into every object: a method's would land in every other's
    assert not [k for k, v in compression["properties"].items() if k != "method" and "default" in v]


def test_a_job_the_first_crd_defaulted_still_parses_on_the_cluster():
    """Before the union the CRD filled every method's defaults into spec.compression; such jobs (stored,
    or recorded in status.appliedSpec) must still run after an upgrade, under the old method name too; a setting
    the old CRD did not have takes today's default (lowRanks: the judged set's 1-8)."""
    from netsense.spec import parse_spec

    old = {"method": "overlap", "density": 0.1, "errorFeedback": True, "warmupSteps": 0, "rank": 1,
           "startIter": 10, "alpha": 0.5, "initialRatio": 0.01, "kneeDensity": 0.004, "probeEvery": 8}
    with pytest.warns(FutureWarning):
        job = parse_spec({"compression": old})
    assert job.compression == {"method": "tta", "values": "fp16", "errorFeedback": True, "momentumCorrection": True,
                               "momentumMasking": False, "warmupSteps": 0, "selection": "exact", "kneeDensity": 0.004,
                               "stepLaw": "inverse", "densityExponent": 0.109,
                               "minDensity": 0.001, "window": 10, "probeEvery": 8, "probeGain": 2.0,
                               "adaptiveProbing": True, "probePadding": False, "lowRanks": [1, 2, 4, 8],
                               "lowRankKnee": 2.3,
                               "lowRankMomentumCorrection": False}
    # ... and one recorded (status.appliedSpec) with the settings since removed, at their defaults, filled in
    recorded = {**job.compression, "learnKnee": False, "familyPilot": False, "convTopkPrior": 1.0,
                "familyPilotExponent": 1.70}
    assert parse_spec({"compression": recorded}).compression == job.compression
    with pytest.raises(SpecError, match="density: applies to method topk"):
        parse_spec({"compression": {"method": "tta", "density": 0.01}})  # a user's own value, not a default


@pytest.mark.parametrize("profile, field, says", [
    ({"type": "static", "rate": "50Mbit", "delay": 10}, "delay", "'10ms' or '10s'"),
    ({"type": "static", "rate": "50Mbit", "delay": "10"}, "delay", "has no unit"),
    ({"type": "static", "rate": "50Mbit", "loss": 1}, "loss", "'1%'"),
    ({"type": "static", "rate": "50Mbit", "loss": "150%"}, "loss", "between 0% and 100% (got 150%)"),
    ({"type": "static", "rate": "-5Mbit"}, "rate", "must be positive"),
    ({"type": "steps", "steps": [{"at": 0, "rate": "1Gbit"}]}, "steps[0].at", "has no unit"),
    ({"type": "fluctuating", "min": "1Mbit", "max": "2Mbit", "period": 30}, "period", "'30s'"),
])
def test_a_bare_number_where_a_unit_belongs_is_refused_with_the_unit_to_write(profile, field, says):
    """tc users read a bare delay as milliseconds and a bare loss as percent; a job would read seconds and a
    fraction: 100x and 1000x apart. So the unit is required, and the error says which to write."""
    with pytest.raises(SpecError) as e:
        parse_spec({"network": {"profile": profile}})
    assert [i.path for i in e.value.issues] == [f"spec.network.profile.{field}"]
    assert says in e.value.issues[0].message


def test_max_seconds_may_be_bare_seconds_as_its_name_says():
    assert parse_spec({"training": {"maxSeconds": 30}}).training["maxSeconds"] == 30
    assert parse_spec({"training": {"maxSeconds": "2m"}}).training["maxSeconds"] == "2m"


LATE = {"workers": 2, "training": {"model": "mlp", "dataset": "synthetic", "maxSteps": 5}}

def test_a_profile_change_after_the_training_budget_is_a_warning_at_validation_and_after_the_run():
    from netsense.spec.job import warnings_for
    from netsense.train.results import summary_lines

    job = parse_spec({**LATE, "training": {**LATE["training"], "maxSeconds": "20s"},
                      "network": {"profile": {"type": "steps", "steps": [{"at": "0s", "rate": "200Mbit"},
                                                                         {"at": "10s", "rate": "100Mbit"},
                                                                         {"at": "60s", "rate": "50Mbit"}]}}}, "j")
    assert warnings_for(job) == ["spec.network.profile: the link's change at 60 s comes after this job's training "
                                 "budget (training.maxSeconds) of 20 s: never seen"]
    looped = {"type": "trace", "loop": True, "points": [{"at": "0s", "rate": "1Gbit"}, {"at": "60s", "rate": "1Mbit"}]}
    assert warnings_for(parse_spec({**LATE, "training": {**LATE["training"], "maxSeconds": "20s"},
                                    "network": {"profile": looped}}, "j")) == []
    lines = summary_lines({"job": "j", "status": "Succeeded", "target_accuracy": 0.9, "target_reached": False,
                           "warnings": ["spec.network.profile: ... never seen"]})
    assert lines[0].startswith("j: Succeeded, target missed") and lines[-1] == "  warning: spec.network.profile: ... never seen"
