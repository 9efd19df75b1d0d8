"""Time to accuracy as the trainer records it (Trainer._evaluate, Trainer._result), on an accuracy curve the test
sets: no process group, no model, no clock.

The target counts once it has held for ``targetHold`` evaluations in a row (one lucky evaluation is not a
trained model); the time to accuracy is the training time of the first of them. Until then a run with
stopAtTarget goes on training, and a run that never held it says so (``target_reached`` false, no time)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from netsense.spec import parse_spec
from netsense.train import trainer as trainer_module
from netsense.train.trainer import Trainer


def _trainer(monkeypatch, **target) -> Trainer:
    """Rank 0's trainer of a job with these training settings (default: target 0.9 held 3 evaluations), its
    model and hook stand-ins that nothing here calls."""
    target = target or {"targetAccuracy": 0.9, "targetHold": 3}
    job = parse_spec({"workers": 2, "training": {"model": "mlp", "dataset": "digits", "maxSteps": 100, **target}},
                     "tta-curve")
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # not this test process's threads
    trainer = Trainer(job, 0, 2)
    trainer.model, trainer.eval_x, trainer.eval_y = SimpleNamespace(module=None), None, None
    trainer.batches, trainer.hook = [None] * 10, SimpleNamespace(history=[])  # 10 steps an epoch, no records
    return trainer


def _run(trainer: Trainer, curve: list[float], monkeypatch) -> list[bool]:
    """Evaluate at steps 10, 20, ... (training time 1.5 s a step of ten) with these accuracies; returns whether
    the run would stop after each evaluation."""
    accuracies = iter(curve)
    monkeypatch.setattr(trainer_module, "evaluate", lambda *args, **kwargs: next(accuracies))
    stops = []
    for i in range(len(curve)):
        trainer.state.step, trainer.state.train_time = 10 * (i + 1), 1.5 * (i + 1)
        trainer._evaluate()
        stops.append(trainer._local_stop())
    return stops


def test_the_time_to_accuracy_is_the_first_of_the_evaluations_that_held_the_target(monkeypatch):
    trainer = _trainer(monkeypatch)
    stops = _run(trainer, [0.5, 0.91, 0.9, 0.95, 0.97], monkeypatch)
    assert stops == [False, False, False, True, True]  # stopAtTarget: once the third evaluation in a row held it
    result = trainer._result(64, 10.0)
    assert result["time_to_accuracy_s"] == 3.0 and result["target_reached"] is True  # step 20's, at 3.0 s
    assert result["target_accuracy"] == 0.9 and result["target_hold"] == 3
    assert [a for _, _, a in result["accuracy_curve"]] == [0.5, 0.91, 0.9, 0.95, 0.97]
    assert result["best_accuracy"] == 0.97 and result["final_accuracy"] == 0.97


def test_an_evaluation_below_the_target_breaks_its_hold_and_the_count_starts_again(monkeypatch):
    trainer = _trainer(monkeypatch)
    stops = _run(trainer, [0.91, 0.92, 0.89, 0.93, 0.94, 0.95, 0.99], monkeypatch)
    assert stops == [False, False, False, False, False, True, True]
    result = trainer._result(64, 12.0)
    assert result["time_to_accuracy_s"] == 6.0 and result["target_reached"] is True  # step 40's, not step 10's


def test_a_target_crossed_but_never_held_is_not_reached(monkeypatch):
    trainer = _trainer(monkeypatch)
    stops = _run(trainer, [0.5, 0.92, 0.95, 0.8, 0.96, 0.97, 0.6], monkeypatch)
    assert not any(stops), "a run whose target never held stopped at it"
    result = trainer._result(64, 12.0)
    assert result["time_to_accuracy_s"] is None and result["target_reached"] is False
    assert result["best_accuracy"] == 0.97 and result["final_accuracy"] == 0.6


@pytest.mark.parametrize("curve, tta", [([0.95], 1.5), ([0.5, 0.89, 0.9], 4.5)])
def test_a_hold_of_one_counts_the_first_evaluation_at_or_above_the_target(monkeypatch, curve, tta):
    trainer = _trainer(monkeypatch, targetAccuracy=0.9, targetHold=1)
    assert _run(trainer, curve, monkeypatch)[-1] is True
    assert trainer._result(64, 10.0)["time_to_accuracy_s"] == tta


def test_without_a_target_nothing_is_reached_or_missed(monkeypatch):
    trainer = _trainer(monkeypatch, stopAtTarget=True)
    assert _run(trainer, [0.99, 0.99, 0.99], monkeypatch) == [False, False, False]
    result = trainer._result(64, 5.0)
    assert result["target_accuracy"] is None and result["target_reached"] is None
    assert result["time_to_accuracy_s"] is None
