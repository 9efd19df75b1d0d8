"""Results -> one row per method and scenario: means and spreads over seeds, regret, the paired comparison
with the best other method (same seeds, a t interval on the log ratios from 5 pairs, wins), what the method
did to the bottleneck (queueing delay, drops, the cross traffic's goodput), and every seed's record.

A calibration's cost (issue 66): a run that used a penalties profile (tta's ``compression.penalties``; its
result's ``penalties.cost``, netsense.control.penalties) is charged the calibration in full: its time to target
plus the profile's cost in seconds (``cost_seconds``: the training seconds of the calibration's raced runs, on the
simulated clock; an older profile's wall seconds). The full charge is per run it serves: a grid that gives one
profile, made once, to all its cells charges it to every seed's cell, as if each were the one run the calibration
was made for. Beside it the amortized time, time to target plus cost / AMORTIZED_OVER (the calibration shared by
that many runs of the same model). For such a method regret, the paired comparison (the best other method is
chosen by charged means too), wins, the further targets and the sensitivity ratios all use the charged time; its
own time to target (``tta_mean_s``) stays in the row. A method without a profile has nothing charged: its numbers
are what they were before.
"""

from __future__ import annotations

import csv
import math
import os
import statistics

from netsense.bench.grid import NO_WIRE, sensitivity_groups
from netsense.control.penalties import cost_seconds
from netsense.train.results import curve_of, reaches, result_target

AMORTIZED_OVER = 10  # issue 66: the amortized column shares a calibration over this many runs of the same model


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _spread(values: list[float]) -> float | None:
    return statistics.stdev(values) if len(values) > 1 else (0.0 if values else None)


def reached_at(result: dict, target: float | None = None) -> tuple[int, float] | None:
    """(step, training seconds) at which ``target`` (default: the run's own) was reached: the first of
    ``target_hold`` evaluations in a row that meet it, as the trainer counts (results from before that
    rule: the first crossing). ``target`` is of the run's own target's metric: an accuracy (at or above it, on
    accuracy_curve) or, for a run with targetLoss, a loss (at or below it, on loss_curve). None: right-censored
    (not held within what the run trained), or a run without a target."""
    own = result_target(result)
    if own is None and target is None:
        return None
    metric = own[0] if own else "accuracy"
    target = own[1] if target is None else target
    hold = result.get("target_hold", 1)
    run: list[tuple[int, float]] = []
    for step, t, value in curve_of(result, metric):
        run = run + [(step, t)] if reaches(metric, value, target) else []
        if len(run) >= hold:
            return run[0]
    return None


def steps_to_target(result: dict) -> int | None:
    """Training steps to the run's target: accuracy per step, apart from speed."""
    at = reached_at(result)
    return None if at is None else at[0]


def time_to(result: dict, target: float) -> float | None:
    """Training seconds to ``target`` read off the accuracy curve: a lower target than the one the run
    stopped at is reached on the way (the early target of a grid's ``targets``)."""
    if result.get("status") != "Succeeded":
        return None
    at = reached_at(result, target)
    return None if at is None else at[1]


def accuracy_after_epochs(result: dict, epochs: float) -> float | None:
    """Test accuracy at the last evaluation within the first ``epochs`` epochs, for a run that trained at
    least that long (None: it stopped earlier, at its target or its budget: censored)."""
    curve = result.get("accuracy_curve") or []
    steps, done = result.get("steps"), result.get("epochs")
    if result.get("status") != "Succeeded" or not curve or not steps or not done:
        return None
    limit = epochs * round(steps / done)  # steps per epoch
    if steps < limit:
        return None
    within = [a for st, _, a in curve if st <= limit]
    return within[-1] if within else None


def worst_queue_p99(result: dict) -> float | None:
    """The p99 queueing delay of the run's worst shaped link (ms)."""
    links = (result.get("bottleneck") or {}).get("links") or {}
    return max((link["queue_delay_p99_ms"] for link in links.values()), default=None)


def step_queue_delay(result: dict) -> float | None:
    """The median over steps of each step's worst queueing delay (ms): what a typical step does to the queue,
    where the p99 over the run also weighs the dense warm-up (from the cell's timeline.csv; local runs)."""
    path = result.get("timeline")
    if not path or not os.path.exists(path):
        return None
    with open(path) as fh:
        worst = [float(r["queue_delay_max_ms"]) for r in csv.DictReader(fh) if r.get("queue_delay_max_ms")]
    return statistics.median(worst) if worst else None


def bottleneck_drops(result: dict) -> int | None:
    links = (result.get("bottleneck") or {}).get("links") or {}
    return sum(link["drops"] for link in links.values()) if links else None


def cross_goodput(result: dict) -> float | None:
    """The cross traffic's total goodput while on (Mbit/s)."""
    flows = (result.get("bottleneck") or {}).get("cross_traffic") or {}
    return sum(f["mean_mbit_when_on"] for f in flows.values()) if flows else None


def calibration(result: dict) -> dict | None:
    """What the run's penalties profile cost, charged to it: {"seconds", "clock", "file"} (seconds None where the
    profile recorded no cost: nothing charged, clock "unrecorded"); None: the run used no profile. A raw result
    carries it as the trainer recorded the profile (``penalties``: file, cost, factors), a table's per-seed record
    as this (``calibration``)."""
    if "calibration" in result:
        return result["calibration"]
    used = result.get("penalties")
    if not isinstance(used, dict):
        return None
    seconds, clock = cost_seconds(used.get("cost"))
    return {"seconds": seconds, "clock": clock, "file": used.get("file")}


def charged(result: dict, t: float | None, over: int = 1) -> float | None:
    """A time (``t``: the run's time to a target) with the run's calibration charged: in full (``over`` 1), or
    shared by ``over`` runs; ``t`` itself for a run without a profile (or without a recorded cost), None where
    ``t`` is None (not reached)."""
    cost = calibration(result)
    if t is None or cost is None or cost.get("seconds") is None:
        return t
    return t + cost["seconds"] / over


def compared_mean(row: dict) -> float | None:
    """The mean a row is compared by (regret, the best other method): its charged mean where its runs used a
    penalties profile, else its mean time to target."""
    return row["tta_charged_mean_s"] if "tta_charged_mean_s" in row else row["tta_mean_s"]


def _calibration_columns(row_runs: list[dict], runs: list[dict], ttas_of, reached: bool) -> dict:
    """The row's calibration columns, where any of its runs used a profile (else none): the cost charged
    (mean over the runs that used one, and its clock), the charged and amortized times to target."""
    costs = [c for r in row_runs if (c := calibration(r)) is not None]
    if not costs:
        return {}
    seconds = [c["seconds"] for c in costs if c.get("seconds") is not None]
    full = [charged(r, t) for r in runs if (t := ttas_of(r)) is not None]
    shared = [charged(r, t, AMORTIZED_OVER) for r in runs if (t := ttas_of(r)) is not None]
    return {"calibration_s": _mean(seconds), "calibration_clock": "+".join(sorted({c["clock"] for c in costs})),
            "calibration_files": sorted({str(c.get("file")) for c in costs}),
            "tta_charged_mean_s": _mean(full) if reached else None,
            "tta_charged_std_s": _spread(full) if reached else None,
            "tta_amortized_mean_s": _mean(shared) if reached else None, "amortized_over": AMORTIZED_OVER}


SEED_KEYS = ("status", "time_to_accuracy_s", "steps", "bytes_sent_per_worker", "mean_density", "best_accuracy",
             "final_accuracy", "throughput_samples_per_s", "value_encoding", "wire_bytes_per_element",
             "link_rate_mbit_min", "link_rate_mbit_median", "link_rate_mbit_max", "reason", "lowrank_steps")


def seed_record(result: dict) -> dict:
    """What a table keeps of one run, so that every number it and the README quote can be recomputed from the
    committed table alone (the runs' own directories are not kept): its time, steps, bytes, density, accuracy,
    the rates it trained under, its encoding."""
    cost = calibration(result)
    return {"seed": result.get("seed", 0), "steps_to_target": steps_to_target(result),
            "accuracy_curve": result.get("accuracy_curve"),
            # a loss target's run is read off its loss curve: kept with it (an accuracy run's is not needed)
            **({k: result.get(k) for k in ("target_metric", "loss_curve")} if result.get("target_metric") == "loss"
               else {}),
            **{k: result.get(k) for k in SEED_KEYS if result.get(k) is not None},
            **({"calibration": cost} if cost is not None else {})}


def summarize(results: list[dict], family: dict[str, str] | None = None) -> list[dict]:
    """One row per (scenario, method): means and spreads over seeds, regret, and the paired comparison with
    the best method outside the row's family (``family``: label -> family, netsense.bench.grid.families)."""
    rows: dict[tuple[str, str], dict] = {}
    for r in results:
        key = (r["scenario"], r["method_label"])
        rows.setdefault(key, {"scenario": key[0], "method": key[1], "runs": []})["runs"].append(r)
    out = []
    for row in rows.values():
        runs = [r for r in row["runs"] if r.get("status") == "Succeeded"]
        ttas = [r["time_to_accuracy_s"] for r in runs if r.get("time_to_accuracy_s") is not None]
        reached = len(ttas) == len(row["runs"]) and runs
        out.append({
            "scenario": row["scenario"], "method": row["method"], "seeds": len(row["runs"]),
            "reached": f"{len(ttas)}/{len(row['runs'])}",
            "tta_mean_s": _mean(ttas) if reached else None, "tta_std_s": _spread(ttas) if reached else None,
            "steps_to_target": _mean([x for x in map(steps_to_target, runs) if x is not None]) if reached else None,
            "samples_per_s": _mean([r["throughput_samples_per_s"] for r in runs]),
            "best_accuracy": _mean([r["best_accuracy"] for r in runs if r.get("best_accuracy") is not None]),
            "final_accuracy": _mean([r["final_accuracy"] for r in runs if r.get("final_accuracy") is not None]),
            # mean_ratio: the same, in results written before the rename (reused from an earlier --out)
            "mean_density": _mean([d for r in runs if (d := r.get("mean_density", r.get("mean_ratio"))) is not None]),
            "wire_mb_per_worker": _mean([r["bytes_sent_per_worker"] / 1e6 for r in runs
                                         if r.get("bytes_sent_per_worker") is not None]),
            "bytes_per_step": _mean([r["bytes_sent_per_worker"] / r["steps"] for r in runs if r.get("steps")]),
            "selection_ms": _mean([r["selection_ms_mean"] for r in runs if r.get("selection_ms_mean") is not None]),
            "queue_p99_ms": _mean([q for q in map(worst_queue_p99, runs) if q is not None]),
            "step_queue_ms": _mean([q for q in map(step_queue_delay, runs) if q is not None]),
            "drops": _mean([d for d in map(bottleneck_drops, runs) if d is not None]),
            "cross_mbit": _mean([x for x in map(cross_goodput, runs) if x is not None]),
            "failed": len(row["runs"]) - len(runs),
            "failures": [{"seed": r.get("seed"), "reason": r.get("reason") or r.get("status") or "no result"}
                         for r in row["runs"] if r.get("status") != "Succeeded"],
            "per_seed": [seed_record(r) for r in sorted(row["runs"], key=lambda r: r.get("seed", 0))],
            **_calibration_columns(row["runs"], runs, lambda r: r.get("time_to_accuracy_s"), bool(reached)),
        })
    for scenario in {r["scenario"] for r in out}:
        in_scenario = [r for r in out if r["scenario"] == scenario]
        best = min((m for r in in_scenario if (m := compared_mean(r)) is not None), default=None)
        for r in in_scenario:
            mean = compared_mean(r)
            r["regret"] = (mean / best) if best and mean is not None else math.inf
    paired_against_best_other(results, out, family=family)
    return sorted(out, key=lambda r: (r["scenario"], r["regret"]))


MIN_PAIRS_FOR_INTERVAL = 5  # below this many paired seeds no interval is printed: it would not cover


def gmean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def t_interval(ratios: list[float], level: float = 0.95, min_pairs: int = MIN_PAIRS_FOR_INTERVAL
               ) -> tuple[float | None, float | None, float | None]:
    """(low, high, two-sided p of "the geometric mean is 1") of paired ratios: Student's t on the log ratios
    (the seeds' ratios are what varies; a t interval covers at n = 10 where a percentile bootstrap under-covers),
    back-transformed. None below ``min_pairs`` pairs (a registered set may state fewer, at least 2)."""
    n = len(ratios)
    if n < max(2, min_pairs):
        return None, None, None
    from scipy import stats as st  # here only: a bench's summary, not a run's start-up

    logs = [math.log(r) for r in ratios]
    mean, sd = statistics.fmean(logs), statistics.stdev(logs)
    se = sd / math.sqrt(n)
    if se == 0:
        return math.exp(mean), math.exp(mean), 0.0 if mean else 1.0
    q = float(st.t.ppf(0.5 + level / 2, n - 1))
    p = float(2 * st.t.sf(abs(mean) / se, n - 1))
    return math.exp(mean - q * se), math.exp(mean + q * se), p


def seeds_for(ratios: list[float], relative: float = 0.10, level: float = 0.95) -> int | None:
    """How many paired seeds would give the geometric mean of ratios like these a ``level`` t interval of
    +-``relative`` (on the log scale: half-width log(1 + relative)), at their sample spread; None below
    MIN_PAIRS_FOR_INTERVAL (no spread worth the name). How many seeds a grid must register to resolve a bar."""
    if len(ratios) < MIN_PAIRS_FOR_INTERVAL:
        return None
    from scipy import stats as st

    sd, target = statistics.stdev(math.log(r) for r in ratios), math.log(1 + relative)
    n = MIN_PAIRS_FOR_INTERVAL
    while float(st.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n) > target:
        n += 1
    return n


def holm(p_values: list[float | None]) -> list[bool | None]:
    """Holm's step-down correction at 5%: which of the comparisons stay significant when all of them are
    counted (None where there is no p)."""
    indexed = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    out: list[bool | None] = [None if p is None else False for p in p_values]
    m = len(indexed)
    for rank, (p, i) in enumerate(indexed):
        if p > 0.05 / (m - rank):
            break
        out[i] = True
    return out


def paired_against_best_other(results: list[dict], rows: list[dict],
                              tta_of=lambda r: r.get("time_to_accuracy_s"), family: dict[str, str] | None = None
                              ) -> None:
    """Add to each row its paired comparison with the best other method of its scenario (the lowest mean
    TTA among those outside its family, ``family``: label -> family; by default each method is its own):
    the geometric mean over common seeds of TTA / the other's TTA, its 95% t interval (paired_ratio), and the
    fraction of the scenario's seeds on which the method was the fastest of all. A method leads only
    where the whole interval is below 1. ``tta_of``: a result's TTA (another target's). Every time compared is
    charged its run's calibration (``charged``), and the best other is chosen by ``compared_mean``."""
    family = family or {}
    tta: dict[tuple[str, str], dict[int, float]] = {}
    for r in results:
        if r.get("status") == "Succeeded" and (t := charged(r, tta_of(r))) is not None:
            tta.setdefault((r["scenario"], r["method_label"]), {})[r.get("seed", 0)] = t
    for scenario in {r["scenario"] for r in rows}:
        in_scenario = [r for r in rows if r["scenario"] == scenario]
        seeds = {r.get("seed", 0) for r in results if r["scenario"] == scenario}
        fastest = {s: min(((t[s], m) for (sc, m), t in tta.items() if sc == scenario and s in t), default=None)
                   for s in seeds}
        for row in in_scenario:
            row.update(vs=None, paired_ratio=None, ratio_lo=None, ratio_hi=None, pairs=0,
                       wins=sum(1 for f in fastest.values() if f and f[1] == row["method"]) / max(1, len(seeds)))
            mine_family = family.get(row["method"], row["method"])
            others = [r for r in in_scenario if family.get(r["method"], r["method"]) != mine_family
                      and compared_mean(r) is not None]
            mine = tta.get((scenario, row["method"]), {})
            if not others or not mine:
                continue
            other = min(others, key=compared_mean)
            ratio, lo, hi, pairs = paired_ratio(mine, tta.get((scenario, other["method"]), {}))
            if pairs:
                row.update(vs=other["method"], paired_ratio=ratio, ratio_lo=lo, ratio_hi=hi, pairs=pairs)


def paired_ratio(mine: dict[int, float | None], theirs: dict[int, float | None]
                 ) -> tuple[float | None, float | None, float | None, int]:
    """(geometric mean, 95% t interval low and high (None below 5 pairs), pairs) of mine / theirs over the
    seeds both have a time for; (None, None, None, 0) without one. A seed either did not reach (None) is left
    out."""
    ratios = seed_ratios(mine, theirs)
    if not ratios:
        return None, None, None, 0
    lo, hi, _ = t_interval(ratios)
    return gmean(ratios), lo, hi, len(ratios)


def seed_times(row: dict, charge: bool = True) -> dict[int, float | None]:
    """A table row's seed -> time to accuracy (None: not reached), from its per-seed records: what paired_ratio
    and seed_ratios compare; a seed that used a penalties profile charged its calibration in full (``charge``;
    False: its own time alone)."""
    return {s["seed"]: charged(s, s.get("time_to_accuracy_s")) if charge else s.get("time_to_accuracy_s")
            for s in row.get("per_seed", [])}


def mean_tta(row: dict, charge: bool = True) -> float | None:
    """A table row's mean time to accuracy over its seeds (each charged its calibration, as ``seed_times``); None
    unless every seed reached the target."""
    ttas = [t for t in seed_times(row, charge).values() if t is not None]
    return statistics.fmean(ttas) if ttas and len(ttas) == len(row.get("per_seed", [])) else None


def seed_ratios(mine: dict[int, float | None], theirs: dict[int, float | None]) -> list[float]:
    """mine / theirs on every seed both reached the target on (seed -> TTA, None: not reached)."""
    return [mine[s] / theirs[s] for s in sorted(mine.keys() & theirs.keys())
            if mine[s] is not None and theirs[s] is not None and mine[s] > 0 < theirs[s]]


def at_targets(results: list[dict], rows: list[dict], targets: list[float], epochs: float | None,
               family: dict[str, str] | None = None) -> None:
    """Add to each row ``targets``: per further target (read off the accuracy curves), TTA's mean and spread
    (when every seed reached it) and the paired comparison; and with ``epochs`` the test accuracy after that
    many epochs (mean, spread, how many seeds trained that long)."""
    for row in rows:
        row["targets"] = {}
    for target in targets:
        sub = []
        for row in rows:
            runs = [r for r in results if (r["scenario"], r["method_label"]) == (row["scenario"], row["method"])]
            ttas = [t for r in runs if (t := time_to(r, target)) is not None]
            every = len(ttas) == len(runs) and bool(runs)
            sub.append({"scenario": row["scenario"], "method": row["method"], "reached": f"{len(ttas)}/{len(runs)}",
                        "tta_mean_s": _mean(ttas) if every else None, "tta_std_s": _spread(ttas) if every else None,
                        **_calibration_columns(runs, runs, lambda r, t=target: time_to(r, t), every)})
        paired_against_best_other(results, sub, lambda r, t=target: time_to(r, t), family)
        for row, entry in zip(rows, sub, strict=True):
            row["targets"][str(target)] = entry
    if epochs:
        for row in rows:
            runs = [r for r in results if (r["scenario"], r["method_label"]) == (row["scenario"], row["method"])]
            accs = [a for r in runs if (a := accuracy_after_epochs(r, epochs)) is not None]
            row["after_epochs"] = {"epochs": epochs, "mean": _mean(accs), "std": _spread(accs),
                                   "n": f"{len(accs)}/{len(runs)}"}


def sensitivity(results: list[dict], grid: dict) -> list[dict]:
    """One row per variant of the grid's ``sensitivity:`` section and scenario: the geometric mean over
    common seeds of the variant's TTA / the method's own (at its settings), with its bootstrap 95%
    interval, and how many seeds each reached the target (a seed one of them never reached in the budget
    is right-censored and left out of the ratio: the reached counts say how many). A run that used a penalties
    profile is charged its calibration in full (``charged``), in the ratio and in the means."""
    runs: dict[tuple[str, str], dict[int, float | None]] = {}
    for r in results:
        t = charged(r, r.get("time_to_accuracy_s")) if r.get("status") == "Succeeded" else None
        runs.setdefault((r["scenario"], r["method_label"]), {})[r.get("seed", 0)] = t
    scenarios = sorted({r["scenario"] for r in results})
    rows = []
    for method, constant, value, variant in sensitivity_groups(grid):
        for scenario in scenarios:
            mine, base = runs.get((scenario, variant), {}), runs.get((scenario, method), {})
            ratio, lo, hi, pairs = paired_ratio(mine, base)
            rows.append({
                "scenario": scenario, "method": method, "constant": constant, "value": value, "variant": variant,
                "ratio": ratio, "ratio_lo": lo, "ratio_hi": hi, "pairs": pairs,
                "p": t_interval(seed_ratios(mine, base))[2],
                "reached": f"{sum(1 for t in mine.values() if t)}/{len(mine)}",
                "method_reached": f"{sum(1 for t in base.values() if t)}/{len(base)}",
                "tta_mean_s": _mean([t for t in mine.values() if t]),
                "method_tta_mean_s": _mean([t for t in base.values() if t]),
            })
    for row, kept in zip(rows, holm([r["p"] for r in rows]), strict=True):
        row["holm"] = kept  # significant with every row of the table counted (Holm, 5%)
    return rows


def x_allreduce(rows: list[dict], reference: str = "allreduce") -> None:
    """Add to each row its throughput over the reference method's on the same link (samples/s ratio, the
    paper's headline measure), where the grid ran that method."""
    ref = {r["scenario"]: r["samples_per_s"] for r in rows if r["method"] == reference}
    for r in rows:
        own, theirs = r.get("samples_per_s"), ref.get(r["scenario"])
        r["x_allreduce"] = own / theirs if own and theirs else None


def matched_ceiling(rows: list[dict], results: list[dict], batch_size: int) -> None:
    """``ceiling: matched``: each row against its method's twins without the wire (grid.wire_twins), seed by
    seed: the twins' steady samples/s (the ceiling), the row's samples/s over it, and per step the network time
    left exposed, ``samples_per_step x (1/samples_per_s - 1/ceiling)``, against the wire time of the bytes the
    run sent, ``bytes per step and worker x 8 / the link's median rate``: a ratio of 1 means every byte cost its
    wire time and nothing more (no overlap, no overhead), above 1 what the collectives cost beyond the wire
    (latency, the probes' extra steps, waiting on the slower rank), below 1 what overlapped the compute. A
    method without twins of its own (adaptive: grid.wire_twins) is read against the twins of the fixed TopK
    density nearest its mean density in the scenario (``ceiling_from``), whose hook path does the same work a
    step. The twins pay one minimal collective's latency per collective (the link's delay, if it has one, is in
    the ceiling), and a step's bytes are averaged over every step where the samples/s skip the first tenth."""
    by_cell = {(r["scenario"], r["method_label"], r.get("seed", 0)): r for r in results}
    twinned = {label[:-len(NO_WIRE)] for _, label, _ in by_cell if label.endswith(NO_WIRE)}
    for row in rows:
        source = row["method"] if row["method"] in twinned else _nearest_fixed(row, rows, twinned)
        ceilings, exposed, wire = [], [], []
        for (scenario, label, seed), r in by_cell.items():
            if (scenario, label) != (row["scenario"], row["method"]):
                continue
            twin = by_cell.get((scenario, f"{source}{NO_WIRE}", seed)) if source else None
            real, free = r.get("throughput_samples_per_s"), (twin or {}).get("throughput_samples_per_s")
            if not real or not free:
                continue
            ceilings.append(free)
            exposed.append(r.get("workers", 2) * batch_size * (1 / real - 1 / free))
            rate, steps = r.get("link_rate_mbit_median"), r.get("steps")
            if rate and steps and r.get("bytes_sent_per_worker") is not None:
                wire.append(r["bytes_sent_per_worker"] / steps * 8 / (rate * 1e6))
        ceiling = _mean(ceilings)
        row["ceiling_from"] = source if ceiling else None
        row["ceiling_samples_per_s"] = ceiling
        row["ratio_to_ceiling"] = row["samples_per_s"] / ceiling if ceiling and row.get("samples_per_s") else None
        row["exposed_ms"] = 1e3 * _mean(exposed) if exposed else None
        row["wire_ms"] = 1e3 * _mean(wire) if wire else None
        row["exposed_over_wire"] = (row["exposed_ms"] / row["wire_ms"]
                                    if row["exposed_ms"] is not None and row["wire_ms"] else None)


def _nearest_fixed(row: dict, rows: list[dict], twinned: set[str]) -> str | None:
    """The twinned fixed TopK row of the same scenario whose mean density is nearest ``row``'s (on a log scale)."""
    fixed = [r for r in rows if r["scenario"] == row["scenario"] and r["method"] in twinned
             and r.get("mean_density") and r["method"].startswith("topk")]
    if not fixed or not row.get("mean_density") or row["mean_density"] >= 1:  # dense (fp16): no TopK's work
        return None
    return min(fixed, key=lambda r: abs(math.log(r["mean_density"] / row["mean_density"])))["method"]
