"""The in-run reading (netsense.train.reading; spec.training.readingSteps): what each candidate compressor would
keep of a rank's gradient, and that reading it changes nothing of the training."""

from __future__ import annotations

import pytest
import torch
from test_clock import SIMULATED_JOB, _run

from netsense.spec import SpecError, parse_spec
from netsense.train.reading import Reading, candidates


def _observe(reading: Reading, tensors: list[torch.Tensor], step: int, index: int = 0,
             params: list[torch.Tensor] | None = None) -> None:
    flat = torch.cat([t.reshape(-1) for t in tensors])
    views = [v.view_as(t) for v, t in zip(flat.split([t.numel() for t in tensors]), tensors, strict=True)]
    reading.observe(index, flat, views, params or tensors)
    reading.end_step(step, loss=1.0)


def test_each_candidate_keeps_what_its_compressor_would():
    """A gradient whose matrix is exactly rank 1 (PowerSGD at any rank keeps all of it, after one power
    iteration) and whose energy sits in 1% of its elements (TopK at 2% keeps all, at 0.1% a tenth of it, the
    spikes being equal); a vector travels whole under PowerSGD."""
    torch.manual_seed(0)
    u, v = torch.randn(100, 1), torch.randn(1, 50)
    matrix = u @ v
    spiky = torch.zeros(5000)
    spiky[torch.randperm(5000)[:50]] = 10.0  # 1% of the elements, equal magnitude
    bias = torch.randn(100)
    reading = Reading(steps=3)
    _observe(reading, [matrix, bias], 1)
    row = reading.rows[0]
    assert row["powersgd:1"] == pytest.approx(1.0, abs=1e-4) and row["powersgd:4"] == pytest.approx(1.0, abs=1e-4)
    reading = Reading(steps=3)
    _observe(reading, [spiky.view(50, 100)], 1)
    row = reading.rows[0]
    assert row["topk:0.02"] == pytest.approx(1.0) and row["topk:0.001"] == pytest.approx(0.1)
    assert row["topk:0.005"] == pytest.approx(0.5)


def test_captured_fractions_grow_with_density_and_rank_and_the_reading_stops_after_its_steps():
    torch.manual_seed(1)
    reading = Reading(steps=2)
    for step in range(1, 5):
        _observe(reading, [torch.randn(64, 32), torch.randn(32)], step)
    assert [r["step"] for r in reading.rows] == [1, 2]
    for row in reading.rows:
        fractions = [row[c] for c in candidates()]
        assert all(0 < f <= 1 + 1e-6 for f in fractions)
        assert row["topk:0.001"] <= row["topk:0.005"] <= row["topk:0.02"]
        assert row["powersgd:1"] <= row["powersgd:4"]
    record = reading.record()
    assert record["candidates"] == candidates() and record["seconds_per_step"] > 0


def test_a_rebuilt_bucket_holding_other_parameters_keeps_each_parameters_warm_start():
    """DDP rebuilds its buckets after the first step: bucket 0 then holds other parameters (a collision of warm
    starts keyed by place crashed every run of a multi-bucket model: 'mat1 and mat2 shapes cannot be
    multiplied')."""
    a, b = torch.zeros(64, 32), torch.zeros(16, 8)
    reading = Reading(steps=3)
    _observe(reading, [torch.randn(64, 32)], 1, index=0, params=[a])
    _observe(reading, [torch.randn(16, 8), torch.randn(64, 32)], 2, index=0, params=[b, a])
    assert [r["step"] for r in reading.rows] == [1, 2]


def test_a_negative_reading_is_refused_naming_the_field():
    spec = {**SIMULATED_JOB["spec"], "training": {**SIMULATED_JOB["spec"]["training"], "readingSteps": -1}}
    with pytest.raises(SpecError, match="spec.training.readingSteps"):
        parse_spec(spec, "sim")


@pytest.mark.gloo
def test_reading_changes_nothing_of_the_training_and_is_recorded(tmp_path):
    """The same simulated job with and without a reading: the same steps, times and accuracies to the bit (the
    reading draws from its own generator and changes no buffer; its work is not priced by the simulated clock),
    and the reading's rows in result.json."""
    job = {**SIMULATED_JOB, "spec": {**SIMULATED_JOB["spec"], "compression": {"method": "topk", "density": 0.01}}}
    plain, rows = _run(tmp_path, "plain", job)
    reading_job = {**job, "spec": {**job["spec"], "training": {**job["spec"]["training"], "readingSteps": 5}}}
    read, rows_read = _run(tmp_path, "read", reading_job)
    assert rows == rows_read
    for key in ("train_seconds", "accuracy_curve", "final_loss", "steps"):
        assert plain[key] == read[key], key
    assert plain["reading"] is None
    assert [r["step"] for r in read["reading"]["steps"]] == [1, 2, 3, 4, 5]
    assert set(candidates()) <= set(read["reading"]["steps"][0])
