"""The judged set's derived inputs, made mechanically as REGISTRATION.md beside this file says (from the pick
seeds' records only): the clock's inputs a task, the targets, the links and their room to win, and the grids.

    .venv/bin/python testbed/judged/prepare.py inputs            # measure each task's clock inputs (quiet machine)
    .venv/bin/python testbed/judged/prepare.py dense             # the dense grids (pick seeds, to B, no target)
    netsense bench testbed/grids/judged-<task>-dense.yaml --out runs/judged/judged-<task>-dense
    .venv/bin/python testbed/judged/prepare.py targets           # targets.json and the pick-seed sweep grids
    netsense bench testbed/grids/judged-<task>-pick.yaml --out runs/judged/judged-<task>-pick
    .venv/bin/python testbed/judged/prepare.py links TASK        # links.json (room to win), the calibration job,
                                                                 # the judge-seed grids
    netsense calibrate testbed/judged/jobs/<task>-calibrate.yaml --out runs/judged/calibrate-<task>
    .venv/bin/python testbed/judged/prepare.py penalties TASK    # the calibration's profile, committed
    netsense bench testbed/grids/judged-<task>-judge-fixed.yaml --out runs/judged/judged-<task>-judge-fixed
    netsense bench testbed/grids/judged-<task>-adaptive.yaml --out runs/judged/judged-<task>-adaptive
    .venv/bin/python testbed/judged/prepare.py emulated          # emulated.json and the confirmation's grids
    netsense bench testbed/grids/judged-<task>-emulated.yaml --out runs/judged/judged-<task>-emulated   # root

Records: runs/judged/ (not committed); analyze.py --land writes the committed records. gpt ran its dense grid
and nothing after it: cut line (3) dropped it (REGISTRATION.md's amendments; analyze.py's DROPPED).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)

import yaml  # noqa: E402

from netsense.bench.stats import reached_at  # noqa: E402
from netsense.clock.replay import replay  # noqa: E402
from netsense.clock.simulated import FRAMING  # noqa: E402

RUNS = os.path.join(ROOT, "runs", "judged")
RECORDS = os.path.join(ROOT, "testbed", "results", "judged-runs")  # analyze.py --land writes them
GRIDS = os.path.join(ROOT, "testbed", "grids")
B = 2000  # the budget: targets at 80% of it
MAX_STEPS = 3 * B
EVAL_EVERY, HOLD = 40, 2
TARGET_STEPS = (1520, 1560, 1600)
PICK, JUDGE, CALIBRATION_SEED = (3000, 3001, 3002), (3003, 3004, 3005), 3100
ROOM_BAR = 0.15
PLACEHOLDER = {"accuracy": {"targetAccuracy": 0.9999}, "loss": {"targetLoss": 0.001}}
TRACE_SEED = 66
ORDER = ("gru1d", "cnn1d", "mlp1d", "gpt")
TASKS = {
    "gru1d": {"model": "gru1d", "dataset": "mnist1d", "hiddenSize": 512, "batchSize": 32, "lr": 0.2},
    "cnn1d": {"model": "cnn1d", "dataset": "mnist1d", "hiddenSize": 4096, "batchSize": 32, "lr": 0.05},
    "mlp1d": {"model": "mlp", "dataset": "mnist1d", "hiddenSize": 1024, "batchSize": 32, "lr": 0.05},
    "gpt": {"model": "gpt", "dataset": "pysource", "hiddenSize": 256, "contextLength": 64, "batchSize": 16,
            "lr": 0.1},
}
FIXED = {"fp16": {"method": "fp16"},
         **{f"topk-{d:g}": {"method": "topk", "density": d} for d in (0.001, 0.002, 0.005, 0.01, 0.02, 0.05)},
         **{f"powersgd-r{r}": {"method": "powersgd", "rank": r} for r in (1, 2, 4, 8)}}
EMULATED = ("gru1d", "cnn1d")  # the emulated confirmation: B/2, in real time on tc-shaped links
EMULATED_TARGET_STEPS = (720, 760, 800)  # as TARGET_STEPS: the three evaluations ending at 80% of B/2
DEFAULTS = ("topk-0.005", "powersgd-r4", "fp16")  # run on the judge seeds whatever the pick seeds chose
ADAPTIVE = {"tta": {"method": "tta", "lowRanks": [1, 2, 4, 8]}, "netsense": {"method": "netsense"},
            "dc2": {"method": "dc2"}}


def metric(task: str) -> str:
    return "loss" if TASKS[task]["model"] == "gpt" else "accuracy"


def _json(name: str) -> dict:
    path = os.path.join(HERE, name)
    return json.load(open(path)) if os.path.exists(path) else {}


def _save(name: str, data: dict) -> None:
    with open(os.path.join(HERE, name), "w") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.write("\n")


def _training(task: str, seed: int = PICK[0], **more) -> dict:
    return {**TASKS[task], "seed": seed, "evalEvery": EVAL_EVERY, "targetHold": HOLD, "threads": 1, **more}


def _simulation(task: str) -> dict:
    inputs = _json("inputs.json")[task]
    return {k: inputs[k] for k in ("computeSeconds", "compressionSecondsPerMelement", "lowRankSecondsPerMelement")}


def _rate(bps: float) -> str:
    """Two significant figures, in Mbit."""
    mbit = bps / 1e6
    return f"{round(mbit, 1 - int(math.floor(math.log10(mbit)))):g}Mbit"


def profiles(task: str) -> dict:
    r = _json("inputs.json")[task]["R_bps"]
    return {"static-slow": {"type": "static", "rate": _rate(r / 10)},
            "static-fast": {"type": "static", "rate": _rate(r)},
            "static-mid": {"type": "static", "rate": _rate(r / 3)}}


def _target_training(task: str, value: float | None = None, max_steps: int = MAX_STEPS) -> dict:
    value = _json("targets.json")[task]["target"] if value is None else value
    return {("targetLoss" if metric(task) == "loss" else "targetAccuracy"): value, "stopAtTarget": True,
            "maxSteps": max_steps}


def _grid(name: str, header: str, training: dict, task: str, methods: dict, profs: dict, seeds,
          network: dict | None = None) -> str:
    """Write testbed/grids/<name>.yaml; ``network``: the simulated clock at the task's inputs unless given."""
    network = {"clock": "simulated", "simulation": _simulation(task)} if network is None else network
    grid = {"name": name,
            "base": {"workers": 2, "training": training, "network": network},
            "methods": methods, "profiles": profs, "seeds": list(seeds)}
    path = os.path.join(GRIDS, f"{name}.yaml")
    with open(path, "w") as fh:
        fh.write("".join(f"# {line}\n" if line else "#\n" for line in header.splitlines()))
        yaml.safe_dump(grid, fh, sort_keys=False)
    return path


def cmd_inputs(_args) -> None:
    """Each task's clock inputs, measured once (the bench's own measurement) and R, the rate at which dense
    fp16's wire bytes a step take the task's compute."""
    from netsense.control.cost import dense_allreduce_bytes
    from netsense.spec import parse_spec
    from netsense.train import calibrate
    from netsense.train.data import load_dataset
    from netsense.train.models import build_model

    out = _json("inputs.json")
    for task in ORDER:
        spec = parse_spec({"workers": 2, "training": _training(task), "compression": {"method": "tta",
                           "lowRanks": [4]}, "network": {"clock": "simulated"}})
        t = spec.training
        compute, sparse, lowrank = calibrate.inputs_for(t, spec.compression, 2)
        data = load_dataset(t)
        model = build_model(t["model"], data.input_shape, data.classes, t["hiddenSize"])
        numel = sum(p.numel() for p in model.parameters())
        wire = dense_allreduce_bytes(numel, 2, fp16=True)
        out[task] = {"computeSeconds": round(compute, 6), "compressionSecondsPerMelement": round(sparse, 6),
                     "lowRankSecondsPerMelement": round(lowrank, 6), "parameters": numel,
                     "dense_fp16_wire_bytes": wire, "R_bps": wire * FRAMING * 8 / compute}
        print(task, out[task], flush=True)
    _save("inputs.json", out)


def cmd_dense(_args) -> None:
    for task in ORDER:
        path = _grid(f"judged-{task}-dense", f"The judged set (testbed/judged/REGISTRATION.md): {task}'s dense fp16 "
                     f"on the pick seeds, to B = {B} steps without stopping: sets the target (prepare.py targets). "
                     "The bench asks every grid for a target: this one is out of reach and stops nothing.",
                     _training(task, maxSteps=B, stopAtTarget=False, **PLACEHOLDER[metric(task)]), task,
                     {"fp16": FIXED["fp16"]},
                     {"static-slow": profiles(task)["static-slow"]}, PICK)
        print(path)


def _summary(name: str) -> list[dict]:
    """A grid's runs: its bench summary under runs/judged/, else (a fresh machine) the committed records'."""
    path = os.path.join(RUNS, name, "summary.json")
    if os.path.exists(path):
        with open(path) as fh:
            return json.load(fh)
    from netsense.bench import store

    task, grid = name.removeprefix("judged-").split("-", 1)
    kept = [r for r in (store.load(RECORDS) if store.resolve(RECORDS) else []) if r["task"] == task
            and r["grid"] == grid]
    if not kept:
        raise FileNotFoundError(path)
    return kept


def _curve(result: dict, task: str) -> dict[int, float]:
    key = "loss_curve" if metric(task) == "loss" else "accuracy_curve"
    return {step: value for step, _, value in result[key]}


def dense_target(runs: list[dict], task: str, steps=TARGET_STEPS) -> tuple[float, dict[int, float]]:
    """The target dense fp16 sets: each pick seed's metric averaged over ``steps`` (around 80% of the budget),
    then the least demanding seed's (the lowest accuracy, the highest loss), to 4 decimals."""
    per_seed = {r["seed"]: statistics.mean(_curve(r, task)[s] for s in steps) for r in runs}
    assert sorted(per_seed) == list(PICK), per_seed
    value = max(per_seed.values()) if metric(task) == "loss" else min(per_seed.values())
    return round(value, 4), per_seed


def cmd_targets(_args) -> None:
    targets = _json("targets.json")
    for task in ORDER:
        try:
            runs = _summary(f"judged-{task}-dense")
        except FileNotFoundError:
            print(f"{task}: no dense runs yet", file=sys.stderr)
            continue
        value, per_seed = dense_target(runs, task)
        targets[task] = {"metric": metric(task), "target": value, "per_pick_seed": per_seed}
        print(task, targets[task])
        _save("targets.json", targets)
        compressed = {k: v for k, v in FIXED.items() if k != "fp16"}
        _grid(f"judged-{task}-pick", f"The judged set (testbed/judged/REGISTRATION.md): {task}'s compressed fixed "
              f"options on the pick seeds, stopping at the target ({metric(task)} {targets[task]['target']}, held "
              f"{HOLD}x) or {MAX_STEPS} steps; trained on the slow link, priced on every link by replay.",
              {**_training(task), **_target_training(task)}, task, compressed,
              {"static-slow": profiles(task)["static-slow"]}, PICK)
    _save("targets.json", targets)


# -- room to win -----------------------------------------------------------------------------------------------

def _with_target(result: dict, task: str, value: float | None = None) -> dict:
    """A run held to the task's target, or to ``value`` (the dense runs to B ran without one)."""
    value = _json("targets.json")[task]["target"] if value is None else value
    return {**result, "target_metric": metric(task), f"target_{metric(task)}": value, "target_hold": HOLD}


def fixed_runs(task: str, seeds=PICK, names=("dense", "pick"), target: float | None = None
               ) -> dict[str, dict[int, dict]]:
    """option -> seed -> result, every fixed run of the task on ``seeds``, held to the task's target (or
    ``target``)."""
    out: dict[str, dict[int, dict]] = {}
    for name in names:
        try:
            runs = _summary(f"judged-{task}-{name}")
        except FileNotFoundError:
            continue
        for r in runs:
            if r["seed"] in seeds and r["method_label"] in FIXED:
                out.setdefault(r["method_label"], {})[r["seed"]] = _with_target(r, task, target)
    return out


def option_time(result: dict, profile: dict) -> float:
    """Training seconds to the target on ``profile`` (inf: not reached within the run's steps)."""
    at = reached_at(result)
    return math.inf if at is None else replay(result, profile)[at[0] - 1]


def mean_time(runs: dict[int, dict], profile: dict) -> float:
    return statistics.mean(option_time(r, profile) for r in runs.values())


def step_seconds(result: dict, rate_profile: dict) -> float:
    """The option's steady step time on a static link (its median replayed step)."""
    times = replay(result, rate_profile)
    steps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    return statistics.median(steps)


def _intervals(profile: dict, horizon: float) -> list[tuple[float, float, float]]:
    """(start, end, bps) of the profile's constant-rate intervals up to ``horizon`` (then one to infinity)."""
    from netsense.shaping.profiles import build_profile

    p = build_profile(profile)
    out, t = [], 0.0
    while t < horizon:
        nxt = p.next_change(t)
        end = math.inf if nxt is None else nxt
        out.append((t, end, p.rate_at(t)))
        t = end
    if out and out[-1][1] != math.inf:
        out.append((out[-1][1], math.inf, p.rate_at(out[-1][1])))
    return out


def oracle_time(runs: dict[str, dict[int, dict]], profile: dict, horizon: float) -> float:
    """The time of the oracle that trains, in each constant-rate interval, with the option that progresses
    fastest there (progress of option o a second at rate r: 1 / (S_o x t_o(r))), progress adding up."""
    steps = {o: statistics.mean(reached_at(r)[0] if reached_at(r) else math.inf for r in rs.values())
             for o, rs in runs.items()}
    done, cache = 0.0, {}
    for start, end, bps in _intervals(profile, horizon):
        if bps not in cache:
            static = {"type": "static", "rate": f"{bps:.0f}bit"}
            cache[bps] = max(1 / (steps[o] * statistics.mean(step_seconds(r, static) for r in rs.values()))
                             for o, rs in runs.items() if steps[o] < math.inf)
        rate = cache[bps]
        if done + rate * (end - start) >= 1:
            return start + (1 - done) / rate
        done += rate * (end - start)
    return math.inf


def best_fixed(runs: dict[str, dict[int, dict]], profile: dict) -> tuple[str, float]:
    times = {o: mean_time(rs, profile) for o, rs in runs.items()}
    o = min(times, key=times.get)
    return o, times[o]


def switch(task: str, first: str, then: str, at: float) -> dict:
    ps = profiles(task)
    return {"type": "steps", "steps": [{"at": "0s", "rate": ps[first]["rate"]},
                                       {"at": f"{at:.3f}s", "rate": ps[then]["rate"]}]}


def room(runs, profile: dict) -> dict:
    option, t_fixed = best_fixed(runs, profile)
    t_oracle = oracle_time(runs, profile, t_fixed)
    return {"best_fixed": option, "t_fixed": round(t_fixed, 3), "t_oracle": round(t_oracle, 3),
            "room": round(1 - t_oracle / t_fixed, 4)}


def cmd_links(args) -> None:
    task = args.task
    runs = fixed_runs(task)
    assert set(runs) == set(FIXED), f"{task}: pick-seed runs missing: {set(FIXED) - set(runs)}"
    ps = profiles(task)
    found: dict[str, dict] = {}
    for name, (first, then) in {"switch-down": ("static-fast", "static-slow"),
                                "switch-up": ("static-slow", "static-fast")}.items():
        lo, hi = 0.0, max(best_fixed(runs, ps[first])[1], best_fixed(runs, ps[then])[1])
        for _ in range(40):  # tau: the hindsight-best fixed option spends half its time before it
            tau = (lo + hi) / 2
            _, t = best_fixed(runs, switch(task, first, then, tau))
            lo, hi = (tau, hi) if tau < t / 2 else (lo, tau)
        profile = switch(task, first, then, tau)
        found[name] = {"profile": profile, **room(runs, profile)}
    dense = runs["fp16"]
    mid_rate = math.sqrt(float(ps["static-slow"]["rate"][:-4]) * float(ps["static-fast"]["rate"][:-4]))
    t_mid = mean_time(dense, {"type": "static", "rate": f"{mid_rate:g}Mbit"})
    trace = {"type": "fluctuating", "min": ps["static-slow"]["rate"], "max": ps["static-fast"]["rate"],
             "period": f"{t_mid / 10:.3f}s", "seed": TRACE_SEED}
    found["trace"] = {"profile": trace, **room(runs, trace)}
    for name, f in found.items():
        print(f"{task} {name}: room {f['room']:.1%} (best fixed {f['best_fixed']} {f['t_fixed']} s, oracle "
              f"{f['t_oracle']} s) {f['profile']}")
    name = max(found, key=lambda n: found[n]["room"])
    chosen = name if found[name]["room"] >= ROOM_BAR else "static-mid"
    scenarios = {"static-slow": ps["static-slow"], "static-fast": ps["static-fast"],
                 chosen: found[chosen]["profile"] if chosen in found else ps["static-mid"]}
    best = {s: best_fixed(runs, p)[0] for s, p in scenarios.items()}
    picked = sorted(set(best.values()) | set(DEFAULTS))
    links = _json("links.json")
    links[task] = {"candidates": found, "chosen": chosen, "scenarios": scenarios, "picked": best,
                   "judge_fixed": picked}
    _save("links.json", links)
    # the calibration job, and the judge seeds' grid (the picked fixed options; the adaptive methods)
    os.makedirs(os.path.join(HERE, "jobs"), exist_ok=True)
    job = {"apiVersion": "netsense.dev/v1alpha1", "kind": "NetSenseJob", "metadata": {"name": f"judged-{task}"},
           "spec": {"workers": 2, "training": {**_training(task, seed=CALIBRATION_SEED), **_target_training(task)},
                    "compression": {"method": "tta"}, "network": {"clock": "simulated"}}}
    with open(os.path.join(HERE, "jobs", f"{task}-calibrate.yaml"), "w") as fh:
        fh.write(f"# The judged set's calibration of {task} (REGISTRATION.md): netsense calibrate, its defaults.\n")
        yaml.safe_dump(job, fh, sort_keys=False)
    rooms = ", ".join(f"{n} {f['room']:.1%}" for n, f in found.items())
    tta = {**ADAPTIVE["tta"], "penalties": f"testbed/judged/penalties/{task}.json"}
    _grid(f"judged-{task}-judge-fixed", f"The judged set (testbed/judged/REGISTRATION.md): {task}'s fixed options "
          f"on the judge seeds: those the pick seeds chose ({links[task]['picked']}) and the defaults; priced on "
          f"every scenario by replay.", {**_training(task), **_target_training(task)}, task,
          {o: FIXED[o] for o in picked}, {"static-slow": ps["static-slow"]}, JUDGE)
    _grid(f"judged-{task}-adaptive", f"The judged set (testbed/judged/REGISTRATION.md): {task}'s adaptive methods on "
          f"the judge seeds, on its three scenarios. Room to win of the changing candidates (pick seeds): {rooms}; "
          f"chosen: {chosen}.", {**_training(task), **_target_training(task)}, task,
          {"tta": tta, "netsense": ADAPTIVE["netsense"], "dc2": ADAPTIVE["dc2"]}, scenarios, JUDGE)
    print(f"{task}: chosen {chosen}; judge-seed fixed options {picked}")


def cmd_penalties(args) -> None:
    src = os.path.join(RUNS, f"calibrate-{args.task}", "penalties.json")
    os.makedirs(os.path.join(HERE, "penalties"), exist_ok=True)
    shutil.copyfile(src, os.path.join(HERE, "penalties", f"{args.task}.json"))
    print(f"testbed/judged/penalties/{args.task}.json")


def cmd_emulated(_args) -> None:
    """The emulated confirmation (REGISTRATION.md): tta and the hindsight-best fixed option on the judge seeds, in
    real time on tc-shaped links, with jobs of half the budget: the target is dense's at 80% of B/2 (the same
    rule), the fixed option the best on the pick seeds' records at that target, each scenario's."""
    links, out = _json("links.json"), _json("emulated.json")
    for task in EMULATED:
        value, per_seed = dense_target(_summary(f"judged-{task}-dense"), task, EMULATED_TARGET_STEPS)
        runs = fixed_runs(task, target=value)
        scenarios = {s: links[task]["scenarios"][s] for s in ("static-slow", links[task]["chosen"])}
        best = {s: best_fixed(runs, p)[0] for s, p in scenarios.items()}
        out[task] = {"metric": metric(task), "target": value, "per_pick_seed": per_seed, "max_steps": MAX_STEPS // 2,
                     "scenarios": scenarios, "best": best}
        tta = {**ADAPTIVE["tta"], "penalties": f"testbed/judged/penalties/{task}.json"}
        path = _grid(f"judged-{task}-emulated", f"The judged set's emulated confirmation (testbed/judged/REGISTRATION.md):"
                     f" {task}, tta and the hindsight-best fixed option of each scenario ({best}) on the judge seeds, in"
                     f" real time on tc-shaped links (root); half the budget: {metric(task)} {value} (dense's at 80% "
                     f"of B/2 = {B // 2} steps), at most {MAX_STEPS // 2} steps.",
                     {**_training(task), **_target_training(task, value, MAX_STEPS // 2)}, task,
                     {"tta": tta, **{o: FIXED[o] for o in sorted(set(best.values()))}}, scenarios, JUDGE, network={})
        print(f"{task}: target {value}, best {best}: {path}")
        # The simulated side of the comparison needs each of those options on the judge seeds: those the
        # judge-fixed grid did not run, run as it runs them (to the full target, which passes the lower one).
        missing = sorted(set(best.values()) - set(links[task]["judge_fixed"]))
        if missing:
            print(_grid(f"judged-{task}-emulated-sim", f"The judged set's emulated confirmation: the simulated side's "
                        f"fixed options of {task} on the judge seeds that judge-fixed did not run ({missing}), as "
                        f"judge-fixed runs them.", {**_training(task), **_target_training(task)}, task,
                        {o: FIXED[o] for o in missing}, {"static-slow": profiles(task)["static-slow"]}, JUDGE))
    _save("emulated.json", out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("inputs").set_defaults(fn=cmd_inputs)
    sub.add_parser("dense").set_defaults(fn=cmd_dense)
    sub.add_parser("targets").set_defaults(fn=cmd_targets)
    sub.add_parser("emulated").set_defaults(fn=cmd_emulated)
    for name, fn in (("links", cmd_links), ("penalties", cmd_penalties)):
        p = sub.add_parser(name)
        p.add_argument("task", choices=ORDER)
        p.set_defaults(fn=fn)
    args = ap.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
