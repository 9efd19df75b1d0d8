"""tta's family pilot: it reads which family trains a task faster, and it never touches the model it reads."""

import math

import pytest
import torch

from netsense.control import pilot
from netsense.control.policies import Decision, StepMeasurement, TimeToAccuracyController

FEATURES, SAMPLES = 2000, 512


def task(classes: int, sparse: bool, seed: int = 0):
    """A linear classifier's data. Sparse: each class lights one feature of its own (the gradient has
    classes x classes entries, 0.5% of the weights, and rank up to ``classes``): TopK 1% sends all of it,
    PowerSGD rank 4 cannot. Dense, two classes: Gaussian inputs with a class-dependent mean (the gradient
    of a two-class linear layer has rank 1 and no zeros): PowerSGD sends all of it, TopK 1% a sliver."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (SAMPLES,), generator=g)
    if sparse:
        x = torch.zeros(SAMPLES, FEATURES)
        x[torch.arange(SAMPLES), y] = 3.0
    else:
        direction = torch.randn(FEATURES, generator=g) / math.sqrt(FEATURES)
        x = torch.randn(SAMPLES, FEATURES, generator=g) * 0.3 + (2 * y.float() - 1).unsqueeze(1) * direction * 3
    torch.manual_seed(seed)
    model = torch.nn.Linear(FEATURES, classes, bias=False)
    batches = [(x[i:i + 32], y[i:i + 32]) for i in range(0, SAMPLES, 32)]
    return model, (batches + batches)[:pilot.MAX_STEPS], (x[:256], y[:256])


def two_workers(model, batches, probe) -> float | None:
    """The pilot as two workers run it: rank 0 the TopK fork, rank 1 PowerSGD's, their totals summed."""
    forks = [pilot.run_fork(model, pilot.fork_family(rank), batches, probe, lr=0.5, momentum=0.9) for rank in (0, 1)]
    assert [f.family for f in forks] == ["topk", "powersgd"]
    return pilot.reading([a + b for a, b in zip(*(f.totals() for f in forks), strict=True)])


@pytest.mark.parametrize("sparse, topk_faster", [(True, True), (False, False)])
def test_the_pilot_reads_which_family_reaches_the_level_first(sparse, topk_faster):
    model, batches, probe = task(10 if sparse else 2, sparse)
    h = two_workers(model, batches, probe)
    assert h is not None and (h < 1) is topk_faster, h


def test_the_pilot_leaves_the_model_and_its_gradients_as_they_were():
    model, batches, probe = task(10, sparse=True)
    model.weight.grad = torch.full_like(model.weight, 0.25)
    before = model.weight.detach().clone()
    two_workers(model, batches, probe)
    assert torch.equal(model.weight, before) and torch.equal(model.weight.grad, torch.full_like(before, 0.25))


def test_forks_that_never_reach_the_level_stop_early_count_as_the_cap_and_give_no_reading():
    """A fork that is not far enough on the way to the level at an EARLY_STOPS checkpoint stops there (the
    CNNs' 16 steps of pilot for nothing cut to 4) and counts as the cap: a bound, never a fast reading."""
    model, batches, probe = task(2, sparse=False)
    fork = pilot.run_fork(model, "topk", batches, probe, lr=1e-9, momentum=0.0)
    assert (fork.steps, fork.reached, fork.spent) == (float(pilot.MAX_STEPS), False, pilot.EARLY_STOPS[0][0])
    stuck = pilot.run_fork(model, "powersgd", batches, probe, lr=1e-9, momentum=0.0).totals()
    assert pilot.reading([a + b for a, b in zip(fork.totals(), stuck, strict=True)]) is None, "the priors stand"
    assert pilot.reading(fork.totals()) is None, "one family alone (one worker) reads nothing"
    there = pilot.run_fork(model, "powersgd", batches, probe, lr=0.5, momentum=0.9)
    assert there.reached and there.spent < pilot.MAX_STEPS
    # The stopped TopK fork against a PowerSGD fork that got there: a bound, TopK at least the cap.
    h = pilot.reading([a + b for a, b in zip(fork.totals(), there.totals(), strict=True)])
    assert h == pytest.approx(pilot.MAX_STEPS / there.steps) and h > 1
    slow = pilot.run_fork(model, "topk", batches, probe, lr=0.01, momentum=0.0, max_steps=6)
    assert not slow.reached and slow.spent == 6 and slow.steps == 6.0, "a fork that moves runs on to its cap"
    for step, _ in pilot.EARLY_STOPS:  # every checkpoint stops a fork that has not moved, there
        stuck = pilot.run_fork(model, "topk", batches, probe, lr=1e-9, momentum=0.0, early_stops=[(step, 0.2)])
        assert stuck.spent == step and stuck.steps == float(pilot.MAX_STEPS) and not stuck.reached
    assert pilot.steps_to([4.0, 3.0, 1.0], 2.0) == pytest.approx(1.5)


@pytest.mark.parametrize("family, lr", [("topk", 0.005), ("topk", 0.02), ("topk", 0.2), ("powersgd", 0.005),
                                        ("powersgd", 0.01), ("powersgd", 0.5)])
def test_reading_the_probe_only_at_the_stops_finds_the_same_step_as_reading_it_every_step(family, lr):
    """Until the last early stop the probe is read at the stops only, and the steps between where the loss has
    reached the level by the next: the fork reads as if every step were read (here crossing at 0.5-14.5 steps:
    before, between and after the stops; at the level 0.5 too), for at most one read more (the stop past the
    crossing)."""
    model, batches, probe = task(2, sparse=False)
    for level in (pilot.HALT_LEVEL, 0.5):
        every: dict[int, float] = {}
        full = pilot.run_fork(model, family, batches, probe, lr=lr, momentum=0.9, early_stops=(), losses=every,
                              level=level)
        stops = [(4, 0.0), (8, 0.0)]  # stops that never stop a fork: only the reading differs
        seen: dict[int, float] = {}
        lazy = pilot.run_fork(model, family, batches, probe, lr=lr, momentum=0.9, early_stops=stops, losses=seen,
                              level=level)
        assert full.reached and (lazy.steps, lazy.reached) == (full.steps, full.reached)
        assert all(every[step] == pytest.approx(loss) for step, loss in seen.items() if step in every)
        assert lazy.reads <= full.reads + 1


@pytest.mark.parametrize("family", ["topk", "powersgd"])
def test_a_fork_step_applies_what_it_compressed_and_keeps_the_rest(family):
    """Error feedback in the fork, whose buffers are reused step to step: each step's update plus the new
    residual is the gradient plus the old residual, TopK's update has DENSITY of the entries, and the velocity
    and weights move as SGD with momentum would with that update."""
    model, batches, _ = task(10, sparse=True)
    fork = pilot._ForkedModel(model, family, seed=0)
    velocity, weights = torch.zeros(FEATURES * 10), model.weight.detach().flatten().clone()
    for x, y in batches[:3]:
        fork.net.zero_grad()
        torch.nn.functional.cross_entropy(fork.net(x), y).backward()
        grad, before = fork.net.weight.grad.flatten().clone(), fork.residual.clone()
        fork.step(x, y, lr=0.5, momentum=0.9)
        update = fork.update.clone()
        assert torch.allclose(update + fork.residual, grad + before, atol=1e-7)
        if family == "topk":
            assert int((update != 0).sum()) <= int(pilot.DENSITY * grad.numel())
        velocity = 0.9 * velocity + update
        weights -= 0.5 * velocity
        assert torch.allclose(fork.net.weight.detach().flatten(), weights, atol=1e-6)


def test_a_fork_stopped_at_the_first_stop_reads_the_probe_twice():
    model, batches, probe = task(2, sparse=False)
    fork = pilot.run_fork(model, "topk", batches, probe, lr=1e-9, momentum=0.0)
    assert (fork.spent, fork.reads) == (pilot.EARLY_STOPS[0][0], 2)


def test_the_pilot_reading_sets_topks_price_against_powersgds_and_with_it_the_family():
    """read_family_pilot(R): TopK at the pilot's density costs R x PowerSGD at its rank in steps, whatever the
    step law; TopK's density is unchanged. A 1000 x 1000 matrix at 50 Mbit/s and 0.2 s of compute: with the
    priors (lowRankKnee 2.3) TopK wins; where the pilot reads R = 2.2 (the MLP on digits32), rank 4 wins."""
    def controller(step_law: str) -> TimeToAccuracyController:
        c = TimeToAccuracyController(1_000_000, 2, probe_every=1000, step_law=step_law,
                                     low_ranks={r: ([(1000, 1000)], 0) for r in (1, 2, 4)})
        c.update(StepMeasurement(50e6 / 8, 50e6 / 8, 1.0, 0.2, 1.0))
        return c

    for law in ("inverse", "power"):
        c = controller(law)
        density = c.sparse_density()
        assert c.decide().rank == 0, "the priors alone: TopK"
        c.read_family_pilot(2.2, pilot.DENSITY, pilot.RANK)
        assert c.steps_factor(pilot.DENSITY) / c.lowrank_steps_factor(pilot.RANK) == pytest.approx(2.2)
        assert c.sparse_density() == pytest.approx(density)
        assert c.decide() == Decision(dense=False, rank=4)
        c.read_family_pilot(1.0, pilot.DENSITY, pilot.RANK)  # a second reading replaces the first
        assert c.steps_factor(pilot.DENSITY) == pytest.approx(c.lowrank_steps_factor(pilot.RANK))


def test_the_calibration_is_a_power_of_the_reading():
    assert pilot.calibrated_ratio(1.0, 2.0) == 1.0
    assert pilot.calibrated_ratio(1.4, 2.0) == pytest.approx(1.96)


def test_a_pair_of_workers_forks_on_the_same_batches_and_probe_and_pairs_differ():
    """Common random numbers: the TopK fork (even rank) and the PowerSGD fork (the odd rank beside it) train on
    the same batches and read the same probe samples, so their reading compares families, not batches (on
    their own batches the reading spread twice as wide on set 2's task); another pair has its own. The probe
    samples are none the forks trained on."""
    from netsense.train.data import load_dataset
    from netsense.train.trainer import pilot_inputs

    data = load_dataset({"dataset": "digits", "seed": 7})
    # 4 workers of 4 samples: 16 steps of 16 for each pair leave digits room for a held-out probe.
    inputs = [pilot_inputs(data, 4, rank, 4, seed=7) for rank in range(4)]
    (b0, p0), (b1, p1), (b2, p2), _ = inputs
    assert len(b0) == pilot.MAX_STEPS and all(x.shape[0] == 4 * 4 for x, _ in b0), "a step: the job's whole batch"
    assert all(torch.equal(x0, x1) and torch.equal(y0, y1) for (x0, y0), (x1, y1) in zip(b0, b1, strict=True))
    assert torch.equal(p0[0], p1[0]) and len(p0[1]) == pilot.PROBE_SAMPLES // 4
    assert not torch.equal(b0[0][0], b2[0][0]) and not torch.equal(p0[0], p2[0])
    big, _ = pilot_inputs(data, 128, 0, 8, seed=7)  # 8 workers' 128 each: more than a rank's shard of digits
    assert len(big) == pilot.MAX_STEPS and 0 < big[0][0].shape[0] < 128 * 8, "a step of at most a shard"
    # The probe is held out: no probe sample is in any pair's pilot batches (digits has room for that).
    trained = torch.cat([x for b, _ in inputs for x, _ in b]).flatten(1)
    for _, (px, _) in inputs:
        assert not (torch.cdist(px.flatten(1), trained) == 0).any(), "the forks trained on their probe"
