"""netsense.clock.replay: a fixed method's recorded steps priced on another link equal a live run on that link."""

from __future__ import annotations

import copy

import pytest
from test_clock import SIMULATED_JOB, _run

from netsense.bench.stats import reached_at
from netsense.clock.replay import NotReplayable, replay, time_to_target

STATIC = {"type": "static", "rate": "300Mbit"}
STEPS = {"type": "steps", "steps": [{"at": "0s", "rate": "200Mbit"}, {"at": "0.3s", "rate": "15Mbit"},
                                    {"at": "0.6s", "rate": "120Mbit"}]}


def _job(compression: dict, profile: dict, **training) -> dict:
    job = copy.deepcopy(SIMULATED_JOB)
    job["spec"]["compression"] = compression
    job["spec"]["network"]["profile"] = profile
    job["spec"]["network"]["simulation"]["jitter"] = 0.05  # seeded per step and collective: replayed too
    job["spec"]["training"].update(maxSteps=60, evalEvery=10, targetAccuracy=0.13, stopAtTarget=False, **training)
    return job


@pytest.mark.gloo
@pytest.mark.parametrize("compression", [{"method": "topk", "density": 0.01},
                                         {"method": "powersgd", "rank": 2, "values": "fp16"},
                                         {"method": "fp16"}], ids=["topk", "powersgd", "fp16"])
def test_a_fixed_runs_steps_replayed_on_another_link_take_the_live_runs_times(tmp_path, compression):
    """Trained once on a static link, priced on a step-wise one: every step's training time, and the time to the
    target, as a live run on the step-wise link reads them (its training is the same: same losses)."""
    on_static, static_rows = _run(tmp_path, "static", _job(compression, STATIC))
    live, rows = _run(tmp_path, "steps", _job(compression, STEPS))
    assert [r["loss"] for r in rows] == [r["loss"] for r in static_rows]
    replayed = replay(on_static, STEPS)
    assert len(replayed) == live["steps"] == on_static["steps"]
    assert [round(t, 4) for t in replayed] == [float(r["time"]) for r in rows]
    assert reached_at(on_static) is not None, "the job's target should be reached within its steps"
    assert time_to_target(on_static, STEPS) == pytest.approx(reached_at(live)[1], abs=1e-3)
    # and on its own link, its own times
    assert replay(on_static, STATIC)[-1] == pytest.approx(on_static["train_seconds"], abs=1e-3)


@pytest.mark.gloo
def test_a_controllers_run_and_a_time_budgeted_run_are_refused(tmp_path):
    controller, _ = _run(tmp_path, "tta", _job({"method": "tta"}, STATIC))
    assert controller["step_shapes"] is None
    with pytest.raises(NotReplayable, match="decides by the steps' times"):
        replay(controller, STEPS)
    budgeted, _ = _run(tmp_path, "budget", _job({"method": "topk", "density": 0.01}, STATIC, maxSeconds="10s"))
    with pytest.raises(NotReplayable, match="maxSeconds"):
        replay(budgeted, STEPS)
    with pytest.raises(NotReplayable, match="real clock"):
        replay({**budgeted, "clock": "real"}, STEPS)
