"""Time to accuracy as the trainer records it (Trainer._evaluate, Trainer._result), on an accuracy curve the test
sets: no process group, no model, no clock.

The target counts once it has held for ``targetHold`` evaluations in a row (one lucky evaluation is not a
trained model); the time to accuracy is the training time of the first of them. Until then a run with
stopAtTarget goes on training, and a run that never held it says so (``target_reached`` false, no time)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from netsense.spec import SpecError, parse_spec
from netsense.train import trainer as trainer_module
from netsense.train.trainer import Evaluation, Trainer


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


def _run(trainer: Trainer, curve: list[float], monkeypatch, losses: list[float] | None = None) -> list[bool]:
    """Evaluate at steps 10, 20, ... (training time 1.5 s a step of ten) with these accuracies (and these
    losses; default: 1 - accuracy); returns whether the run would stop after each evaluation."""
    evaluations = iter(Evaluation(a, 1 - a if losses is None else losses[i]) for i, a in enumerate(curve))
    monkeypatch.setattr(trainer_module, "evaluate", lambda *args, **kwargs: next(evaluations))
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


# ---- a loss target (targetLoss): the same hold, in the other direction, on the evaluations' mean loss -------------

def test_a_loss_target_counts_evaluations_at_or_below_it_and_is_read_off_the_loss_curve(monkeypatch):
    from netsense.bench.stats import reached_at, steps_to_target

    trainer = _trainer(monkeypatch, targetLoss=1.0, targetHold=2)
    # accuracies that would never reach anything: only the loss counts
    stops = _run(trainer, [0.1] * 6, monkeypatch, losses=[2.0, 0.9, 1.2, 1.0, 0.8, 0.7])
    assert stops == [False, False, False, False, True, True]  # step 40 (1.0: at the target) and 50 held it
    result = trainer._result(64, 10.0)
    assert result["target_metric"] == "loss" and result["target_loss"] == 1.0 and result["target_accuracy"] is None
    assert result["time_to_accuracy_s"] == 6.0 and result["target_reached"] is True  # step 40's: 4 x 1.5 s
    assert [v for _, _, v in result["loss_curve"]] == [2.0, 0.9, 1.2, 1.0, 0.8, 0.7]
    assert result["best_eval_loss"] == 0.7 and result["final_eval_loss"] == 0.7
    # the bench reads the same verdict off the curve, and a further (looser) loss target on the way
    assert reached_at(result) == (40, 6.0) and steps_to_target(result) == 40
    assert reached_at(result, 1.5) == (20, 3.0)


def test_a_loss_target_never_held_is_missed_and_said_so(monkeypatch):
    from netsense.train.results import summary_lines

    trainer = _trainer(monkeypatch, targetLoss=0.5)
    assert not any(_run(trainer, [0.99] * 5, monkeypatch, losses=[0.6, 0.4, 0.45, 0.7, 0.3]))
    result = trainer._result(64, 10.0)
    assert result["target_reached"] is False and result["time_to_accuracy_s"] is None
    result["status"] = "Succeeded"
    assert "target loss 0.5: NOT reached" in summary_lines(result)[1]


def test_an_accuracy_run_records_its_loss_curve_and_says_its_metric(monkeypatch):
    trainer = _trainer(monkeypatch)
    _run(trainer, [0.5, 0.91], monkeypatch)
    result = trainer._result(64, 10.0)
    assert result["target_metric"] == "accuracy" and result["target_loss"] is None
    assert [v for _, _, v in result["loss_curve"]] == pytest.approx([0.5, 0.09])


def test_both_targets_are_refused_naming_the_field():
    with pytest.raises(SpecError, match=r"spec.training.targetLoss: give one target, targetAccuracy or targetLoss"):
        parse_spec({"training": {"targetAccuracy": 0.9, "targetLoss": 1.0}})
    with pytest.raises(SpecError, match=r"spec.training.targetLoss: must be > 0"):
        parse_spec({"training": {"targetLoss": 0}})


def test_a_bench_grid_may_set_a_loss_target_and_its_further_targets_are_losses(tmp_path):
    import yaml

    from netsense.bench import load_grid

    def grid(training: dict, **more) -> str:
        base = {"workers": 2, "training": {"model": "mlp", "dataset": "digits", "maxSteps": 50, **training}}
        doc = {"name": "t", "base": base, "methods": {"allreduce": {"method": "allreduce"}},
               "profiles": {"static-100": {"type": "static", "rate": "100Mbit"}}, "seeds": [0], **more}
        (tmp_path / "g.yaml").write_text(yaml.safe_dump(doc))
        return str(tmp_path / "g.yaml")

    assert load_grid(grid({"targetLoss": 0.5}, targets=[2.0, 0.5]))  # looser losses are reached on the way
    with pytest.raises(SpecError, match=r"targets: below base.training.targetLoss \(0.5\).*\(0.4\)"):
        load_grid(grid({"targetLoss": 0.5}, targets=[0.4]))
    with pytest.raises(SpecError, match="base.training: a fair benchmark needs a target"):
        load_grid(grid({}))


def test_the_operator_says_a_loss_target_in_its_condition_and_target_column():
    from netsense_operator import status

    missed = {"target_metric": "loss", "target_loss": 1.2, "target_hold": 2, "best_eval_loss": 1.4567,
              "best_accuracy": 0.3, "time_to_accuracy_s": None}
    assert status.target_summary(missed) == "missed (best loss 1.457)"
    assert status.target_condition(missed) == ("False", "NotReached", "loss 1.2 was not held 2 evaluations in a "
                                                                      "row (best 1.457)")
    reached = {**missed, "time_to_accuracy_s": 12.0}
    assert status.target_condition(reached)[:2] == ("True", "Reached")
    assert status.target_summary(reached) == "reached at 12.0 s"
    # a result from before loss targets: its target is the accuracy
    assert status.target_summary({"target_accuracy": 0.9, "best_accuracy": 0.8}) == "missed (best 0.800)"
