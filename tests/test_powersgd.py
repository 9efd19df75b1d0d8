"""PowerSGD (netsense.compression.lowrank, in our hook) compresses and still trains.

PowerSGD sends a rank-r factorization P Q^T of each weight matrix's averaged gradient. On a gradient of
rank r or less that factorization is exact, so the model receives exactly the all-reduced mean; on a gradient
of higher rank it is not (the method compresses). Both are checked on a Linear layer whose gradient has a
known rank, then a small MLP is trained under it.

The exactness is checked without error feedback: with it, each rank's local error (its own gradient less the
averaged approximation, as large as the gradient when ranks differ) joins its next gradient, and torch's
PowerSGD then amplifies fp32 rounding step after step on such a gradient (seen: 1e-7 of the mean at the first
compressed step, 1e-1 six steps later, under torch's hook; the same in a float64 re-implementation, from
1e-15). What error feedback promises instead, that nothing is lost over the steps, is checked on its own."""

from __future__ import annotations

import pytest
import torch
from support.ranks import batch, ddp_with_hook, run_world, tiny_mlp

IN, OUT = 32, 16  # a 16 x 32 weight: rank r costs (16 + 32) r values, 512 dense
START = 2  # PowerSGD's startIter: dense all-reduce before it
STEPS = 8


def _factors(rank: int, step: int, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(C, X): C (OUT x r) shared by every rank and step, X (r x IN) this rank's at this step; the gradient of
    sum((W X^T) * C) is C X, of rank r, and the ranks' mean C mean(X) is of rank r too."""
    c = torch.randn(OUT, r, generator=torch.Generator().manual_seed(11))
    x = torch.randn(r, IN, generator=torch.Generator().manual_seed(1000 * rank + step))
    return c, x


def low_rank_run(rank: int, world: int, cases: list[tuple], steps: int = STEPS) -> dict:
    """For each (PowerSGD rank, gradient rank, error feedback[, values]), on a model of its own: per step, the
    largest error of the gradient the model received against the exact mean over ranks, relative to the mean's
    largest entry; over the steps, world x the sum of what was received, the sum of what the ranks fed in and the
    local errors they hold at the end (the last two summed over ranks); and each step's wire bytes."""
    import torch.distributed as dist

    out = {}
    for case in cases:
        approx, r, feedback, *values = case
        torch.manual_seed(0)
        model = torch.nn.Linear(IN, OUT, bias=False)
        ddp, state = ddp_with_hook(model, {"method": "powersgd", "rank": approx, "startIter": START, "errorFeedback": feedback,
                                  "values": values[0] if values else "fp32"})
        errors, received, fed = [], torch.zeros(OUT, IN), torch.zeros(OUT, IN)
        for step in range(steps):
            ddp.zero_grad()
            c, x = _factors(rank, step, r)
            (ddp(x) * c.T).sum().backward()
            mean = c @ (sum(_factors(q, step, r)[1] for q in range(world)) / world)
            errors.append(float((model.weight.grad - mean).abs().max() / mean.abs().max()))
            received += world * model.weight.grad
            fed += c @ x
        state.finish()
        held = (state.memory.layout.by_param[id(model.weight)].view(OUT, IN).clone() if state.memory is not None
                else torch.zeros(OUT, IN))  # the residual each rank holds
        totals = torch.stack([fed, held])
        dist.all_reduce(totals)
        out[case] = (errors, received.tolist(), totals[0].tolist(), totals[1].tolist(),
                     [h["wire_bytes"] for h in state.history])
    return out


@pytest.fixture(scope="module")
def low_rank() -> dict:
    """One 2-rank world runs every case (a world costs seconds to start)."""
    cases = [(2, 2, False), (1, 1, False), (1, 2, False), (1, 2, True), (2, 2, False, "fp16"), (1, 2, True, "fp16")]
    return run_world(low_rank_run, 2, cases)[0]


@pytest.mark.gloo
def test_powersgd_is_exact_on_a_gradient_of_its_rank_and_lossy_above_it(low_rank: dict):
    """Without error feedback each step stands alone. Dense steps before startIter are exact; from startIter on,
    a rank-2 gradient through rank-2 PowerSGD (rank 1 through rank 1) arrives as the exact mean (the
    factorization spans it); a rank-2 gradient through rank 1 does not (it was compressed: the configured rank
    is the rank sent)."""
    for case in [(2, 2, False), (1, 1, False), (1, 2, False)]:
        errors = low_rank[case][0]
        assert max(errors[:START]) < 1e-5, f"{case}: a dense step before startIter was not exact: {errors}"
    assert max(low_rank[(2, 2, False)][0][START:]) < 1e-5, low_rank[(2, 2, False)][0]
    assert max(low_rank[(1, 1, False)][0][START:]) < 1e-5, low_rank[(1, 1, False)][0]
    assert min(low_rank[(1, 2, False)][0][START:]) > 1e-2, low_rank[(1, 2, False)][0]


@pytest.mark.gloo
def test_powersgd_error_feedback_keeps_what_the_factorization_missed(low_rank: dict):
    """With error feedback (the default) what rank 1 misses of a rank-2 gradient is held by the ranks and sent
    later: world x everything received == everything fed in - what the ranks still hold. Without it the
    missed part is gone and nothing is held."""
    received, fed, held = (torch.tensor(v) for v in low_rank[(1, 2, True)][1:4])
    assert held.abs().max() > 1e-2, "rank 1 on a rank-2 gradient was to leave an error behind"
    torch.testing.assert_close(received, fed - held, rtol=1e-4, atol=1e-4)
    received, fed, held = (torch.tensor(v) for v in low_rank[(1, 2, False)][1:4])
    assert not held.any(), "errorFeedback: false keeps no error"
    assert (received - fed).abs().max() > 1e-2, "without error feedback the missed part was to be lost"


@pytest.mark.gloo
def test_powersgd_with_fp16_values_sends_half_the_bytes_and_error_feedback_keeps_the_rounding(low_rank: dict):
    """values: fp16 casts the factors for the wire only: half of fp32's bytes a compressed step; a gradient of the
    factorization's rank arrives within fp16's rounding; and with error feedback the rounding is held like
    what the factorization missed: world x received == fed - held, as at fp32."""
    fp32, fp16 = low_rank[(2, 2, False)], low_rank[(2, 2, False, "fp16")]
    assert fp16[4][START:] == [b / 2 for b in fp32[4][START:]], (fp32[4], fp16[4])
    assert fp16[4][:START] == fp32[4][:START]  # the dense steps before startIter: fp32, as PowerSGD's are
    assert max(fp16[0][START:]) < 2e-3, f"beyond fp16's rounding: {fp16[0]}"
    assert max(fp16[0][START:]) > 1e-6, "no rounding at all: the factors did not travel as fp16"
    received, fed, held = (torch.tensor(v) for v in low_rank[(1, 2, True, "fp16")][1:4])
    assert held.abs().max() > 1e-2
    torch.testing.assert_close(received, fed - held, rtol=1e-4, atol=1e-4)


def training_run(rank: int, world: int, steps: int, start: int | None = START,
                 extra: dict | None = None) -> tuple[float, float, list[bool]]:
    """Held-out loss before and after ``steps`` SGD steps under rank-1 PowerSGD (startIter ``start``; None: the
    default; ``extra``: more settings), and which steps were dense."""
    config = {"method": "powersgd", **({} if start is None else {"startIter": start}), **(extra or {})}
    model, state = ddp_with_hook(tiny_mlp(), config, momentum=0.9)
    momentum, _ = state.optimizer_terms(0.9, 0.0)  # 0 where the hook applies it (momentumCorrection)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    x_test, y_test = batch(99, 0, n=256)

    def held_out() -> float:
        with torch.no_grad():
            return float(torch.nn.functional.cross_entropy(model.module(x_test), y_test))

    before = held_out()
    for step in range(steps):
        x, y = batch(rank, step, n=32)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    state.finish()
    return before, held_out(), [h["dense"] for h in state.history]


@pytest.mark.gloo
def test_powersgd_trains_a_small_mlp():
    """30 steps of rank-1 PowerSGD (compressed from step 2 on) more than halve the held-out loss of the MLP
    (1.6 to about 0.4 here): the low-rank updates follow the gradient."""
    before, after, dense = run_world(training_run, 2, 30)[0]
    assert dense[:START] == [True] * START and not any(dense[START:]), "PowerSGD was to compress from startIter"
    assert after < 0.5 * before, f"held-out loss {before:.3f} -> {after:.3f}"


@pytest.mark.gloo
def test_powersgd_compresses_from_the_first_step_by_default():
    """No dense step a user did not ask for: startIter defaults to 0 (the warm start and the residual follow
    their parameters through DDP's bucket rebuild), and the first step already trains."""
    before, after, dense = run_world(training_run, 2, 30, None)[0]
    assert not any(dense), "a dense step nobody asked for"
    assert after < 0.5 * before, f"held-out loss {before:.3f} -> {after:.3f}"


@pytest.mark.gloo
def test_powersgd_with_momentum_correction_trains_as_ttas_low_rank_steps_do():
    """momentumCorrection: the hook compresses each rank's velocity (its residual kept by error feedback) and
    the optimizer applies no momentum: how tta's low-rank steps run. It trains the MLP as the published
    setting does."""
    before, after, dense = run_world(training_run, 2, 30, None, {"momentumCorrection": True})[0]
    assert not any(dense)
    assert after < 0.5 * before, f"held-out loss {before:.3f} -> {after:.3f}"


def recorded_ranks(rank: int, world: int, ranks: list[int], steps: int = 3) -> dict:
    """For each PowerSGD rank, on an MLP of its own: each step's record (the rank, whether dense, the elements
    sent); and the elements that rank's factors and the parameters sent whole come to (lowrank.layout)."""
    from netsense.compression.lowrank import layout

    out = {}
    for r in ranks:
        model, state = ddp_with_hook(tiny_mlp(), {"method": "powersgd", "rank": r})
        for step in range(steps):
            x, y = batch(rank, step, n=32)
            model.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
        state.finish()
        matrices, whole = layout([tuple(p.shape) for p in model.parameters()], r)
        factors = sum(min(r, n, m) * (n + m) for n, m in matrices) + whole
        out[r] = [(h["lowrank_rank"], h["dense"], h["elements_sent"]) for h in state.history], factors
    return out


@pytest.mark.gloo
def test_the_rank_each_step_records_is_the_rank_it_sent_and_every_rank_records_the_same():
    """The timeline's rank column (and the result's lowrank_steps) is read off the step records: each says the
    rank whose factors went on the wire (the MLP's 5 x 64 layer travels whole above rank 2: too small to gain),
    and every rank of the job recorded the same."""
    first, second = run_world(recorded_ranks, 2, [1, 2, 4])
    assert first == second, "the ranks recorded different steps"
    for r, (records, factors) in first.items():
        assert records == [(r, False, factors)] * 3, (r, factors, records)
    assert first[1][1] < first[2][1] < first[4][1] < 1669  # three different payloads, each smaller than dense
