"""A penalties profile: each compression option's steps to a loss milestone over dense fp16's, measured on the
user's own task by ``netsense calibrate`` (netsense.bench.calibration), and what tta reads from it
(``compression.penalties``). Importable without torch: the spec validates a profile when it loads a job.

The file (penalties.json)::

    {"netsense_penalties": 1,                      # the format's version
     "job": "quick",                               # the job it was measured on
     "milestone": {"loss": 0.81, "smoothing": "trailing mean of 10 steps", "dense_steps": {"0": 38, "1": 41}},
     "seeds": [0, 1],
     "cost": {"wall_seconds": 212.4, "steps": 3880, "runs": 16, "train_seconds": 41.3, "clock": "simulated"},
     "topk": {"0.01": {"steps_factor": 1.31, "interval": [0.9, 1.9], "steps": {"0": 50, "1": 53}},
              "0.001": {"steps_factor": 3.2, "lower_bound": true, "interval": null, "steps": {"0": null, ...}}},
     "powersgd": {"2": {...}, "8": {...}}}

Each option's ``steps_factor`` is the geometric mean over the seeds of its steps to the milestone over dense
fp16's steps with the same seed; ``interval`` a 95% Student t interval on the log ratios (null with one seed;
with two seeds t has one degree of freedom, 12.7 x the standard error: a wide interval, reported as it is).
An option that did not reach the milestone within the calibration's largest budget has ``lower_bound: true``
and ``steps_factor`` is the budget over dense's steps (it takes at least that many), or, where that is lower,
the largest factor of a less compressed option of its family (``budget_bound`` then keeps the budget's). tta reads every
``steps_factor`` as measured (a lower bound as the factor itself: the cheapest it can be).

``cost`` is what the calibration took: ``train_seconds``, the sum over its raced runs of their training seconds
on ``clock``, the clock its runs trained on (``simulated``: netsense calibrate runs every race on the simulated
clock at its own given inputs, netsense.bench.calibration.SIMULATION and a 10 Gbit/s link, so these are simulated
seconds, the unit a simulated bench cell is timed in, with a step priced at those inputs rather than at a cell's
measured ones; a race on the real clock would give real training seconds); ``wall_seconds``, the real seconds the
whole calibration took on its machine (runs side by side, evaluations, start-up: what the person waited);
``steps``, every run's steps, summed; ``runs``. ``cost_seconds`` reads the charge a comparison makes of it
(netsense.bench.stats charges it to every run that used the profile). A profile written before
``train_seconds`` (issue 66) has only ``wall_seconds``: it is read, and charged its wall seconds, on the clock
``wall``, which a table names (a different clock from a simulated cell's: larger where the machine ran the race
slower than the simulated clock prices it, never left out); a profile without any cost is charged nothing, on the
clock ``unrecorded``, which a table names too.

Between the measured densities (ranks) the factor is interpolated linearly in log factor against log density
(log rank); below the smallest it is extrapolated with the slope of the lowest pair; above the largest (less
compression than any measured) the largest's factor is held, not extrapolated towards 1; and never below 1 (no
option is taken to need fewer steps than the dense gradient, which no measurement here could tell from noise).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

FORMAT = 1  # netsense_penalties: the version of the file's format
FAMILIES = ("topk", "powersgd")


def cost_seconds(cost: object) -> tuple[float | None, str]:
    """(seconds, clock) that a profile's ``cost`` charges a run that used it: its ``train_seconds`` on its
    ``clock`` (simulated where it does not say: every calibration so far raced on the simulated clock); an older
    profile's ``wall_seconds`` on the clock ``wall``; (None, "unrecorded") without either."""
    cost = cost if isinstance(cost, dict) else {}
    for key, clock in (("train_seconds", cost.get("clock") or "simulated"), ("wall_seconds", "wall")):
        value = cost.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
            return float(value), clock
    return None, "unrecorded"


class PenaltiesError(ValueError):
    """A penalties file that cannot be read or does not hold a profile (the message says why)."""


def interpolate(points: dict[float, float], x: float) -> float:
    """The steps factor at ``x`` (a density or a rank) from measured (x, factor) points: piecewise linear in
    (log x, log factor), extrapolated below the smallest x with the lowest pair's slope, held above the largest,
    and at least 1."""
    if not points:
        raise ValueError("no measured points to interpolate")
    xs = sorted(points)
    logs = [(math.log(p), math.log(max(points[p], 1e-12))) for p in xs]
    lx = math.log(x)
    if len(logs) == 1 or lx >= logs[-1][0]:
        # above the least compressed option measured: its factor, held. Extrapolated, the factor reached 1 (no
        # penalty) within a decade above 1%, and tta chose TopK at 12% on a task whose 1% cost 1.5x the steps:
        # nothing measured says that more density is free, nor how close to free it is
        value = logs[-1][1]
    else:
        i = 1  # the pair (i-1, i) whose interval holds x, or the nearest end's pair
        while i < len(logs) - 1 and lx > logs[i][0]:
            i += 1
        (x0, y0), (x1, y1) = logs[i - 1], logs[i]
        value = y0 + (y1 - y0) * (lx - x0) / (x1 - x0)
    return max(1.0, math.exp(value))


@dataclass(frozen=True)
class Penalties:
    """A loaded profile: each family's measured steps factors, keyed by density (TopK) and rank (PowerSGD)."""

    topk: dict[float, float]
    powersgd: dict[int, float]
    source: str = ""  # the file it came from
    cost: dict | None = None  # what calibrating cost (training and wall seconds, steps): charged by comparisons

    def topk_factor(self, density: float) -> float:
        """TopK's steps at ``density`` over the dense steps."""
        return interpolate(self.topk, density)

    def powersgd_factor(self, rank: int) -> float:
        """PowerSGD's steps at ``rank`` over the dense steps."""
        return interpolate({float(r): f for r, f in self.powersgd.items()}, float(rank))


def _factors(doc: dict, family: str, key) -> dict:
    entries = doc.get(family)
    if not isinstance(entries, dict) or not entries:
        raise PenaltiesError(f"no measured {family} options (a mapping of option to {{steps_factor: ...}})")
    out = {}
    for name, entry in entries.items():
        try:
            option = key(name)
            factor = float(entry["steps_factor"])
        except (TypeError, ValueError, KeyError):
            raise PenaltiesError(f"{family}.{name}: needs a numeric option and a steps_factor") from None
        if option <= 0 or (family == "topk" and option > 1):
            raise PenaltiesError(f"{family}.{name}: not a {'density in (0, 1]' if family == 'topk' else 'rank'}")
        if not math.isfinite(factor) or factor <= 0:
            raise PenaltiesError(f"{family}.{name}.steps_factor: {entry['steps_factor']!r} is not a positive number")
        out[option] = factor
    return out


def parse(doc: object, source: str = "") -> Penalties:
    """A profile from the file's parsed JSON; PenaltiesError says what is wrong with it."""
    if not isinstance(doc, dict) or doc.get("netsense_penalties") != FORMAT:
        raise PenaltiesError(f"not a penalties profile (netsense_penalties: {FORMAT} missing; "
                             "written by netsense calibrate)")
    return Penalties(topk=_factors(doc, "topk", float), powersgd=_factors(doc, "powersgd", int),
                     source=source, cost=doc.get("cost"))


def load(path: str) -> Penalties:
    """Read a penalties file; PenaltiesError (unreadable, not JSON, not a profile) says why."""
    try:
        with open(path) as fh:
            doc = json.load(fh)
    except OSError as e:
        raise PenaltiesError(f"cannot read {path}: {e.strerror}") from None
    except ValueError as e:
        raise PenaltiesError(f"{path} is not JSON: {e}") from None
    try:
        return parse(doc, path)
    except PenaltiesError as e:
        raise PenaltiesError(f"{path}: {e}") from None
