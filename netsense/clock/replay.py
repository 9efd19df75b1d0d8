"""A fixed method's recorded steps, priced on another link without training again.

On the simulated clock a fixed method's training never reads the clock (its policy, if any, has ``measures =
False``: netsense.control.fixed) and evaluations fall due by step, so its steps (the gradients, what each bucket
sent, the step at which it reached its target) are the same on every link; only what each step costs differs.
The clock records each step's work as it priced it (``SimulatedClock.shapes``, result.json's ``step_shapes``);
``replay`` runs those steps through a fresh SimulatedClock on another profile: the same code the live clock ran,
so a replayed time is what the live run on that link would have read, to rounding (tests/test_replay.py checks
it against live runs on a static and a step-wise link).

What it saves: a study that prices one fixed option on many links trains it once a seed, not once a link.

Refused: a controller's run (tta, the paper's, dc2: its steps follow the link, so it records no shapes), a run
whose time budget (``maxSeconds``) could have stopped it at another step, and a run on the real clock. The
clock's inputs are the run's own (result.json's ``simulation``) unless ``simulation`` overrides them (e.g. a
calibration's runs, trained at given inputs, priced at a task's measured ones).
"""

from __future__ import annotations

from netsense import units
from netsense.bench.stats import reached_at
from netsense.clock.simulated import Collective, ModeledTimer, SimulatedClock
from netsense.compression.steps import StepCounts
from netsense.shaping.profiles import Profile, build_profile
from netsense.spec.job import SIMULATION_LATENCY


class NotReplayable(ValueError):
    """The run's steps cannot be priced on another link (the message says why)."""


def _check(result: dict) -> list[list]:
    if result.get("clock") != "simulated":
        raise NotReplayable("a run on the real clock: its steps' times were measured, not modeled")
    shapes = result.get("step_shapes")
    if shapes is None:
        raise NotReplayable(f"method {result.get('method')!r} decides by the steps' times: its steps follow "
                            "the link (no step_shapes in its result)")
    if result.get("max_seconds"):
        raise NotReplayable("its time budget (maxSeconds) could have stopped it at another step on another link")
    return shapes


def clock_for(result: dict, profile: dict | Profile | None, simulation: dict | None = None, *,
              topology: str = "per-host", procs_per_worker: int = 1) -> SimulatedClock:
    """A fresh simulated clock for ``result``'s world on ``profile`` (a spec's profile or a built one), at the
    run's own clock inputs, or at ``simulation``'s where it gives them."""
    sim = {**(result.get("simulation") or {}), **(simulation or {})}
    if isinstance(profile, dict):
        profile = build_profile(profile)
    return SimulatedClock(profile, result["workers"], sim["computeSeconds"], sim["compressionSecondsPerMelement"],
                          units.parse_duration(sim.get("latency") or SIMULATION_LATENCY),
                          jitter=sim.get("jitter") or 0.0, seed=result.get("seed", 0),
                          lowrank_s_per_melement=sim.get("lowRankSecondsPerMelement"),
                          topology=topology, procs_per_worker=procs_per_worker)


def replay(result: dict, profile: dict | Profile | None, simulation: dict | None = None, **clock_kw) -> list[float]:
    """The training clock after each of ``result``'s steps (index i: after step i + 1) on ``profile``."""
    shapes = _check(result)
    clock = clock_for(result, profile, simulation, **clock_kw)
    times = []
    for count, sparse, lowrank, collectives in shapes:
        counts = StepCounts(sparse_elements=sparse, lowrank_elements=lowrank)
        for _ in range(count):
            timer = ModeledTimer([Collective(kind, wire, blocking, carried)
                                  for kind, wire, blocking, carried in collectives])
            clock.settle(clock.now(), timer, ModeledTimer(), counts)
            times.append(clock.now())
    return times


def time_to_target(result: dict, profile: dict | Profile | None, simulation: dict | None = None,
                   **clock_kw) -> float | None:
    """Training seconds to the run's target on ``profile`` (None: it did not reach it within its steps)."""
    at = reached_at(result)
    if at is None:
        return None
    return replay(result, profile, simulation, **clock_kw)[at[0] - 1]
