"""tta's family pilot: it reads which family trains a task faster, and it never touches the model it reads."""

import math

import pytest
import torch

from netsense.control import pilot
from netsense.control.decision import Decision, StepMeasurement
from netsense.control.tta import TimeToAccuracyController

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
        assert c.decide() == Decision(dense=False, rank=4, fp16=True)
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


def _mlp(seed: int = 0) -> torch.nn.Module:
    """A model with every kind of piece the pilot's PowerSGD fork meets: matrices it compresses, vectors (biases,
    batch norm's affine) sent whole, and batch norm's running statistics, which no factor carries."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 10))


def test_replaying_a_forks_factors_takes_a_model_where_the_fork_went():
    """pilot.replay: the PowerSGD fork's recorded factors, replayed on a copy of the model it started from, give
    its weights and momentum bit for bit, and each matrix's last Q (the live run's warm start): what every rank
    adopts is exactly what the fork trained."""
    from netsense.compression.lowrank import LowRank

    _, batches, probe = task(10, sparse=True)
    model = _mlp()
    fork = pilot.run_fork(model, "powersgd", batches, probe, lr=0.5, momentum=0.9, keep=True).trained
    assert len(fork.factors) >= 2
    live = _mlp()
    params = list(live.parameters())
    lowrank = LowRank()
    velocity = pilot.replay(params, torch.stack(fork.factors), lowrank, lr=0.5, momentum=0.9)
    for mine, theirs in zip(params, fork.params, strict=True):
        assert torch.equal(mine, theirs)
    assert torch.equal(velocity, fork.velocity)
    compressed = [(p, q) for p, q in zip(params, fork.params, strict=True) if id(q) in fork.lowrank.qs]
    assert len(compressed) == len(lowrank.qs) == 1, "the 32 x 2000 matrix (10 x 32 is too small to gain)"
    assert all(torch.equal(lowrank.qs[id(p)], fork.lowrank.qs[id(q)]) for p, q in compressed)


def adoption_run(rank: int, world: int) -> dict:
    """pilot.run with adoption on a 2-rank world, each rank with the model it starts from and its pair's batches
    (the same here); rank OWNER also trains the PowerSGD fork alone for as many steps as the run adopted, as the
    reference."""
    from netsense.compression.lowrank import LowRank

    _, batches, probe = task(10, sparse=True)
    model = _mlp()
    policy = TimeToAccuracyController(sum(p.numel() for p in model.parameters()), world, probe_every=1000,
                                      low_ranks={4: ([(32, FEATURES)], 32 * 3 + 10 * 33)})
    out, adoption = pilot.run(policy, model, batches, probe, lr=0.5, momentum=0.9, exponent=1.7,
                              lowrank=LowRank())
    reference = None
    if rank == pilot.OWNER:
        reference = pilot.run_fork(_mlp(), "powersgd", batches, probe, lr=0.5, momentum=0.9, keep=True)
        for x, y in batches[reference.spent:adoption.steps]:  # the steps it took while the TopK fork ran
            reference.trained.step(x, y, lr=0.5, momentum=0.9)

    def plain(tensors):  # lists: a tensor through the result queue is shared memory gone with its process
        return [t.detach().flatten().tolist() for t in tensors]

    return {"out": out, "steps": adoption.steps, "start_rank": policy.start_rank, "weights": plain(model.parameters()),
            "buffers": plain(b for b in model.buffers() if b.is_floating_point()),
            "velocity": adoption.velocity.tolist(),
            "residual": None if adoption.residual is None else adoption.residual.tolist(),
            "reference": None if reference is None else {
                "spent": reference.spent, "weights": plain(reference.trained.params),
                "buffers": plain(b for b in reference.trained.net.buffers() if b.is_floating_point()),
                "velocity": reference.trained.velocity.tolist(), "residual": reference.trained.residual.tolist()}}


@pytest.mark.gloo
def test_every_rank_adopts_the_owners_powersgd_fork_and_only_the_owner_holds_its_residual():
    """After the pilot every rank has the PowerSGD fork's weights, batch norm statistics and momentum, bit for bit
    (DDP never re-syncs weights: ranks that differed would train apart); the fork's steps are the run's first,
    and its residual is held once (on the owner), not lost and not counted on every rank."""
    from support.ranks import run_world

    ranks = run_world(adoption_run, 2)
    ref = ranks[pilot.OWNER]["reference"]
    for r in ranks:
        assert r["steps"] == r["out"]["adopted_steps"] >= ref["spent"] > 0
        assert r["start_rank"] == pilot.RANK, "the controller's first step goes on with the adopted rank"
        assert r["weights"] == ref["weights"] and r["buffers"] == ref["buffers"]
        assert r["velocity"] == ref["velocity"]
    assert ranks[0]["residual"] is None and ranks[pilot.OWNER]["residual"] == ref["residual"]
    assert any(ref["residual"]), "rank 4 of a 32 x 2000 matrix leaves a residual"
    assert ranks[0]["weights"][0] != [float(x) for x in _mlp()[0].weight.detach().flatten()], "the model moved"
    assert ranks[0]["buffers"][0] != [0.0] * 32, "batch norm's running mean came along"
