"""Error feedback as a user relies on it, on real gloo worlds (2 ranks on loopback).

- The adaptive methods (tta, dc2) switch between sparse and dense steps, and tta with ``lowRanks`` between TopK
  and PowerSGD too: what a step did not send must reach the model exactly once, across a switch of family, a
  dense step and back (no gradient mass lost or counted twice).
- With SGD's momentum, tta corrects it on TopK and dense steps and applies it after the all-reduce on PowerSGD
  steps: a switch converts one into the other without losing or adding any of what momentum SGD would apply.
- The paper's method as the paper runs it (``netsense`` with ``errorFeedback: false``): what a step does not
  send is dropped, never carried into a later step.

The controllers' decisions are forced (the policy's ``decide``, see ``_force``): which kind of step comes when is
then the test's choice, not the timing of a loaded machine."""

from __future__ import annotations

import math

import pytest
import torch
from support.ranks import in_ddp, run_world

N = 50  # one Linear(N, 1) without bias: one bucket of N gradient entries, d/dw = x
SPARSE_DENSITY = 0.1  # k = 5 of 50


def _exact_gradient(rank: int, step: int) -> torch.Tensor:
    """Multiples of 1/8 in [-2, 2]: their sums, halves and fp16 roundings are exact, so conservation can be
    checked to the last bit even through tta's fp16 values."""
    g = torch.Generator().manual_seed(100 * rank + step)
    return torch.randint(-16, 17, (N,), generator=g).float() / 8


class Matrix(torch.nn.Module):
    """One 10 x 5 weight (N entries) whose gradient is the input: a matrix PowerSGD compresses at rank 1."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(10, N // 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.weight * x.view(self.weight.shape)).sum()


def _force(state, method: str, plan: list[str]) -> None:
    """Make the policy decide ``plan[step]`` for each step: "sparse", "dense", "dense16" or "lowrank" (PowerSGD
    at rank 1, tta with lowRanks only). dc2 decides with its own ``decide`` at a density set for the step
    (0.1: sparse; 1: dense, as the all_gather would carry more); tta's decisions have the shapes its
    ``decide`` returns (sparse with fp16 values; dense fp16; dense fp32)."""
    from netsense.control.decision import Decision
    from netsense.control.delay import DelayDriven

    policy = state.policy

    def decide() -> Decision:
        kind = plan[state.step + 1]  # the hook decides a step before counting it
        if method == "dc2":
            assert kind in ("sparse", "dense")
            policy.density = SPARSE_DENSITY if kind == "sparse" else 1.0
            return DelayDriven.decide(policy)
        return {"sparse": Decision(density=SPARSE_DENSITY, fp16=True, dense=False),
                "dense16": Decision(fp16=True), "dense": Decision(), "lowrank": Decision(dense=False, rank=1),
                "padded": Decision(density=SPARSE_DENSITY, fp16=True, dense=False, pad=0.3),
                "lowrank-padded": Decision(dense=False, rank=1, pad=0.3)}[kind]

    policy.decide = decide


def _held(state, momentum: float) -> torch.Tensor:
    """What this rank still holds: its residual, and with momentum what it holds of momentum SGD's eventual
    update (where each gradient's whole contribution is g / (1 - m); memory.SharedMomentum): under momentum
    correction residual + u m / (1 - m), with the shared momentum residual / (1 - m) + U m / (1 - m)."""
    zeros = torch.zeros(N)

    def pieces(layout) -> torch.Tensor:  # by parameter
        return sum((t.view(-1) for t in layout.by_param.values()), zeros)

    residual = pieces(state.memory.layout)
    if not momentum:
        return residual
    local = pieces(state.momentum.layout)
    shared = pieces(state.shared.layout) if state.shared is not None else zeros
    scale = 1 / (1 - momentum) if state.shared_step else 1.0
    return residual * scale + (local + shared) * momentum / (1 - momentum)


def _idle_velocity(state) -> float:
    """The largest velocity the family not running holds (the shared one on a corrected step, the rank's own on a
    PowerSGD step): a switch must have moved it, not left it to be counted later."""
    if getattr(state, "shared", None) is None:
        return 0.0
    idle = state.momentum if state.shared_step else state.shared
    return max((float(v.abs().max()) for v in idle.velocities.values()), default=0.0)


def switching_run(rank: int, world: int, cases: dict[str, tuple]) -> dict:
    """Each case (method, config, plan[, momentum]) on a model of its own: per step, what the model received
    (the averaged update), what this rank fed in and what it holds afterwards (_held; fed and held summed over
    the ranks); and each step's (dense, fp16, rank) as recorded."""
    import torch.distributed as dist

    from netsense.compression import register

    out = {}
    for name, (method, config, plan, *rest) in cases.items():
        momentum = rest[0] if rest else 0.0
        model = Matrix() if any(k.startswith("lowrank") for k in plan) else torch.nn.Linear(N, 1, bias=False)
        ddp = in_ddp(model)
        state = register(ddp, {"method": method, **config}, momentum=momentum)
        assert state.memory is not None, f"{method} runs with error feedback by default"
        _force(state, method, plan)
        start = torch.stack([_held(state, momentum)]) if momentum else torch.zeros(1, N)
        dist.all_reduce(start)
        received, fed, held, idle = [], [], [], []
        for step in range(len(plan)):
            ddp.zero_grad()
            x = _exact_gradient(rank, step)
            ddp(x.view(1, -1)).sum().backward()
            received.append(model.weight.grad.view(-1).clone())
            fed.append(x)
            held.append(_held(state, momentum))
            idle.append(_idle_velocity(state))
        state.finish()
        totals = torch.stack([torch.stack(fed), torch.stack(held)])
        dist.all_reduce(totals)
        kinds = [(h["dense"], h["fp16"], h["lowrank_rank"]) for h in state.history]
        out[name] = (torch.stack(received).tolist(), totals[0].tolist(), totals[1].tolist(), kinds,
                     [h["wire_bytes"] for h in state.history], idle, start[0].tolist())
    return out




PLANS = {  # step 0 compressed too: across DDP's bucket rebuild after it
    "tta": ["sparse", "sparse", "sparse", "dense16", "sparse", "sparse", "dense", "sparse"],
    "dc2": ["sparse", "sparse", "sparse", "dense", "sparse", "sparse", "dense", "sparse"],
    # every switch: TopK -> PowerSGD -> TopK, PowerSGD -> dense -> PowerSGD -> dense -> TopK -> PowerSGD. Dense
    # at fp32 only: a PowerSGD residual is not a multiple of 1/8, so fp16 would round it (a flush at fp16 is
    # the tta plan's, after TopK, whose residual is exact).
    "tta-lowRanks": ["sparse", "lowrank", "lowrank", "sparse", "lowrank", "dense", "lowrank", "dense", "sparse",
                     "lowrank"],
}
PADDED = ["sparse", "padded", "padded", "sparse", "padded"]  # tta's padded probes (probePadding) among its steps
LOWRANK_PADDED = ["lowrank", "lowrank-padded", "lowrank", "lowrank-padded"]  # tta's probes while PowerSGD runs
SWITCHING = {"tta": ("tta", {}, PLANS["tta"]),
             "dc2": ("dc2", {}, PLANS["dc2"]),
             "tta-lowRanks": ("tta", {"lowRanks": [1]}, PLANS["tta-lowRanks"]),
             "tta-padded": ("tta", {"probePadding": True}, PADDED),
             "tta-unpadded": ("tta", {}, ["sparse"] * len(PADDED)),
             "tta-lowrank-padded": ("tta", {"lowRanks": [1]}, LOWRANK_PADDED),
             "tta-lowrank-unpadded": ("tta", {"lowRanks": [1]}, ["lowrank"] * len(LOWRANK_PADDED)),
             # momentum 0.5 (exact halves): PowerSGD steps with the shared momentum, and all corrected
             "tta-lowRanks-momentum": ("tta", {"lowRanks": [1]}, PLANS["tta-lowRanks"], 0.5),
             "tta-lowRanks-momentum-corrected": ("tta", {"lowRanks": [1], "lowRankMomentumCorrection": True},
                                                 PLANS["tta-lowRanks"], 0.5)}
WORLD = 2


@pytest.fixture(scope="module")
def switching() -> list[dict]:
    """One 2-rank world runs every case (a world costs seconds to start)."""
    return run_world(switching_run, WORLD, SWITCHING)


@pytest.mark.gloo
@pytest.mark.parametrize("case", list(SWITCHING))
def test_error_feedback_survives_a_switch_to_dense_and_back(switching: list[dict], case: str):
    """After every step, world x (everything the model received so far) == everything the ranks fed in -
    what they still hold: mass is neither lost at a switch nor counted twice. A dense step sends the
    residual along (none is held after it), and the sparse steps after it start from an empty one. With
    momentum m what the ranks fed is worth fed / (1 - m) (what momentum SGD applies of it in the end)."""
    method, _, plan, *rest = SWITCHING[case]
    momentum = rest[0] if rest else 0.0
    received, fed, held, kinds, _, _, start = switching[0][case]
    want = [(kind.startswith("dense"), kind in ("sparse", "padded", "dense16"),  # fp16 values by default
             int(kind.startswith("lowrank")))
            for kind in plan]
    assert kinds == want, "the forced plan did not run: the test would not cover a switch"
    assert switching[1][case][3] == kinds
    got_so_far = torch.zeros(N)
    fed_so_far = torch.tensor(start)  # what the ranks held before the first step (nothing)
    for step in range(len(plan)):
        got_so_far += WORLD * torch.tensor(received[step])
        fed_so_far += torch.tensor(fed[step]) / (1 - momentum)
        holding = torch.tensor(held[step])
        torch.testing.assert_close(got_so_far, fed_so_far - holding, rtol=0, atol=1e-4 if momentum else 1e-5,
                                   msg=f"{case} step {step}: received != fed - held")
        if momentum:  # a dense step keeps its velocity; the family not running holds none
            assert switching[0][case][5][step] == 0.0, f"{case} step {step}: the idle family still holds a velocity"
            continue
        if plan[step].startswith("dense"):
            assert not holding.any(), f"{case} step {step}: a dense step left a residual behind"
        else:
            assert holding.any(), f"{case} step {step}: a compressed step (5 of 50, or rank 1) sent everything"
    assert switching[1][case][0] == received  # every rank received the same average


@pytest.mark.gloo
def test_powersgd_steps_take_the_momentum_after_the_all_reduce(switching: list[dict]):
    """tta's PowerSGD steps apply the momentum to the averaged update (the update after the first PowerSGD step
    is m x the one before it + its own), not each rank's velocity before compression: the updates differ from the
    all-corrected run's from the first PowerSGD step on and agree before it."""
    shared, corrected = switching[0]["tta-lowRanks-momentum"], switching[0]["tta-lowRanks-momentum-corrected"]
    first = PLANS["tta-lowRanks"].index("lowrank")
    assert shared[0][:first] == corrected[0][:first]
    assert shared[0][first] != corrected[0][first]


@pytest.mark.gloo
def test_a_padded_probe_carries_the_probes_bytes_and_trains_as_an_ordinary_step(switching: list[dict]):
    """probePadding: a probe sends the step's own selection and zeros up to its size. The model receives
    exactly what the same steps without the padding give it (no backlog released), and the wire carries the
    probe's bytes: (5 + 15) entries of 6 bytes from each of the 2 ranks instead of 5."""
    padded, plain = switching[0]["tta-padded"], switching[0]["tta-unpadded"]
    assert padded[0] == plain[0] and padded[2] == plain[2], "padding changed what the model received or kept"
    for step, kind in enumerate(PADDED):
        entries = 5 + (15 if kind == "padded" else 0)
        assert padded[4][step] == entries * 6, f"step {step} ({kind}): {padded[4][step]} bytes on the wire"
    assert plain[4] == [5 * 6] * len(PADDED)


@pytest.mark.gloo
def test_a_probe_while_powersgd_runs_is_its_own_step_with_zeros_after_it(switching: list[dict]):
    """While tta runs PowerSGD its probe is the rank's own step with zeros all_reduced after its Q's (a TopK probe
    would switch families for a step and send the top of PowerSGD's residual at once): the model receives and
    keeps exactly what the unpadded steps give it, and the wire carries 30% of the model's elements more."""
    from netsense.control.cost import dense_allreduce_bytes

    padded, plain = switching[0]["tta-lowrank-padded"], switching[0]["tta-lowrank-unpadded"]
    assert padded[0] == plain[0] and padded[2] == plain[2], "padding changed what the model received or kept"
    extra = dense_allreduce_bytes(math.ceil(0.3 * N), WORLD)
    for step, kind in enumerate(LOWRANK_PADDED):
        assert padded[4][step] == pytest.approx(plain[4][step] + (extra if kind == "lowrank-padded" else 0))


NETSENSE_FIXED = {"method": "netsense", "quantize": False, "pruneFactor": 0.0,
                  "initialRatio": SPARSE_DENSITY, "minRatio": SPARSE_DENSITY, "maxRatio": SPARSE_DENSITY}


def _steady_gradient(rank: int) -> torch.Tensor:
    """The same gradient every step (distinct magnitudes: TopK has no ties)."""
    return torch.randn(N, generator=torch.Generator().manual_seed(7 + rank))


def _top(g: torch.Tensor, k: int) -> torch.Tensor:
    """g's k largest-magnitude entries in place, zeros elsewhere."""
    keep = torch.topk(g.abs(), k).indices
    return torch.zeros_like(g).index_copy_(0, keep, g[keep])


def without_feedback_run(rank: int, world: int, steps: int):
    """The same gradient every step into two models, netsense with error feedback off and on (the ratio
    pinned at 10%, no fp16, no pruning): what each received per step, and whether the first keeps memory."""
    from netsense.compression import register

    runs = {}
    for feedback in (False, True):
        model = torch.nn.Linear(N, 1, bias=False)
        ddp = in_ddp(model)
        state = register(ddp, {**NETSENSE_FIXED, "errorFeedback": feedback})
        x = _steady_gradient(rank)
        received = []
        for _ in range(steps):
            ddp.zero_grad()
            ddp(x.view(1, -1)).sum().backward()
            received.append(model.weight.grad.view(-1).tolist())
        state.finish()
        runs[feedback] = received, [h["dense"] for h in state.history], state.memory is None
    return runs


@pytest.mark.gloo
def test_netsense_without_error_feedback_drops_what_it_does_not_send():
    """The paper's NetSenseML (errorFeedback: false): each sparse step sends the TopK of that step's own
    gradient and nothing else; the entries it leaves out are gone, not added to a later step. (With error
    feedback on, the same steps do carry them: the test can tell the two apart.)"""
    world, steps = 2, 5
    runs = run_world(without_feedback_run, world, steps)[0]
    received, dense, no_memory = runs[False]
    assert dense == [False] * steps  # from step 0: no dense first step
    k = round(SPARSE_DENSITY * N)
    grads = [_steady_gradient(r) for r in range(world)]
    sparse = sum(_top(g, k) for g in grads) / world
    for step in range(steps):
        torch.testing.assert_close(torch.tensor(received[step]), sparse, rtol=0, atol=1e-6,
                                   msg=f"step {step}: not this step's TopK alone")
    assert no_memory, "errorFeedback: false must keep no residual"
    with_feedback, _, without_memory = runs[True]
    assert not without_memory and with_feedback[2] != with_feedback[1], \
        "with error feedback on, the left-out entries were to come later"


# ---- DDP's bucket rebuild after step 0 ------------------------------------------------------------------------

class Reordered(torch.nn.Module):
    """Layers registered a, b but applied b then a: the gradients become ready in another order than DDP's
    first buckets assumed, so it lays its buckets out again after step 0 (other parameters at each index,
    other sizes)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(24, 3), torch.nn.Linear(16, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(torch.tanh(self.b(x)))


REBUILD = {
    "topk": ({"method": "topk", "density": 0.1}, None),
    "topk-momentum": ({"method": "topk", "density": 0.1}, 0.9),
    "netsense-ef": ({"method": "netsense", "errorFeedback": True}, None),
    "dc2": ({"method": "dc2"}, None),
    "tta": ({"method": "tta"}, None),
    # fp32 factors: at fp16 the all_reduce sums them in fp16, a rounding no rank holds (test_powersgd's fp16 test)
    "powersgd": ({"method": "powersgd", "rank": 2, "values": "fp32"}, None),
}


def rebuild_run(rank: int, world: int, steps: int) -> dict:
    """Each method with error feedback through DDP's bucket rebuild, every step sparse (the adaptive ones
    forced): per parameter, what the ranks fed (each rank's own gradient, or velocity with momentum
    correction), what the model received and what the ranks hold, summed over ranks and steps; and the
    bucket layouts after step 0 and at the end."""
    import copy

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from netsense.compression import register

    out = {}
    for name, (config, momentum) in REBUILD.items():
        model = Reordered()
        # Small buckets: several of them, which the rebuild lays out again.
        ddp = DDP(model, gradient_as_bucket_view=True, bucket_cap_mb=0.001)
        state = register(ddp, config, momentum=momentum or 0.0)
        if name in ("dc2", "tta"):
            _force(state, name, ["sparse"] * steps)
        params = list(model.parameters())
        fed = [torch.zeros_like(p) for p in params]
        received = [torch.zeros_like(p) for p in params]
        velocity = [torch.zeros_like(p) for p in params]
        layouts = []
        for step in range(steps):
            x = torch.randn(4, 16, generator=torch.Generator().manual_seed(100 * step + rank))
            alone = copy.deepcopy(model)  # this rank's own gradient, as the hook receives it
            alone(x).sum().backward()
            for i, p in enumerate(alone.parameters()):
                velocity[i] = (momentum or 0.0) * velocity[i] + p.grad
                fed[i] += velocity[i] if momentum else p.grad
            ddp.zero_grad()
            ddp(x).sum().backward()
            for i, p in enumerate(params):
                received[i] += p.grad
            if step in (0, steps - 1):
                layouts.append(sorted(state.memory.layout.layouts.values()))
        state.finish()
        held = [state.memory.layout.by_param[id(p)].view_as(p).clone() for p in params]
        flat = torch.cat([torch.cat([t.view(-1) for t in ts]) for ts in (fed, held)])
        dist.all_reduce(flat)
        n = sum(p.numel() for p in params)
        out[name] = (torch.cat([t.view(-1) for t in received]).tolist(), flat[:n].tolist(), flat[n:].tolist(),
                     layouts, [h["dense"] for h in state.history])
    return out


@pytest.mark.gloo
@pytest.mark.fast  # make test-fast's hook test: every method's hook on DDP, conservation and the ranks' agreement
def test_error_feedback_is_conserved_per_parameter_across_ddps_bucket_rebuild():
    """Compression from step 0 (no dense first step): what a step did not send stays with its parameter when
    DDP lays its buckets out again after step 0, for every method with error feedback: world x received ==
    fed - held, parameter by parameter (a residual keyed by bucket index was dropped where the new bucket's
    size differed, or added to another parameter's gradient where it matched)."""
    steps = 4
    results = run_world(rebuild_run, WORLD, steps)
    for name in REBUILD:
        received, fed, held, layouts, dense = results[0][name]
        assert dense == [False] * steps, f"{name}: every step was to be sparse"
        assert layouts[0] != layouts[1], f"{name}: DDP did not lay its buckets out again (no rebuild to test)"
        assert any(abs(h) > 0 for h in held), f"{name}: nothing held back: the test would not see a loss"
        torch.testing.assert_close(WORLD * torch.tensor(received), torch.tensor(fed) - torch.tensor(held),
                                   rtol=1e-4, atol=1e-5, msg=f"{name}: gradient mass lost or moved")
        assert results[1][name][0] == received


NULL_WIRE = {"allreduce": {"method": "allreduce"}, "topk": {"method": "topk", "density": SPARSE_DENSITY},
             "powersgd": {"method": "powersgd", "rank": 1}}  # the methods a matched ceiling twins (grid.wire_twins)


def null_wire_run(rank: int, world: int, other: int) -> dict:
    """Each method with null_wire on a 10 x 5 matrix for 3 steps, rank 1's gradients drawn from seed ``other``:
    what this rank's model received each step."""
    from netsense.compression import register

    out = {}
    for name, config in NULL_WIRE.items():
        model = Matrix()
        ddp = in_ddp(model)
        state = register(ddp, config, null_wire=True)
        got = []
        for step in range(3):
            ddp.zero_grad()
            x = _exact_gradient(rank if rank == 0 else other, step)
            ddp(x.view(1, -1)).sum().backward()
            got.append(model.weight.grad.view(-1).clone())
        state.finish()
        out[name] = torch.stack(got).tolist()  # plain lists: a tensor crosses the queue as a shared fd
    return out


@pytest.mark.gloo
def test_without_the_wire_each_rank_trains_on_its_own_gradient_alone():
    """training.nullWire (the benchmark's contention-matched ceiling): the fixed methods still run their hook,
    but nothing of another rank's gradient arrives (an adaptive method's decisions come from measurements the
    ranks still agree on, so it gets no twin). Rank 0 receives the same whatever rank 1 computed, and dense
    allreduce hands it its own gradient exactly (the sum of world copies of its own, averaged)."""
    first = run_world(null_wire_run, WORLD, 1)
    second = run_world(null_wire_run, WORLD, 7)
    for name in NULL_WIRE:
        assert first[0][name] == second[0][name], f"{name}: rank 0 received something of rank 1's gradient"
        assert first[1][name] != second[1][name], f"{name}: rank 1's own gradient did not count"
    own = torch.stack([_exact_gradient(0, step) for step in range(3)])
    torch.testing.assert_close(torch.tensor(first[0]["allreduce"]), own, rtol=0, atol=0)
