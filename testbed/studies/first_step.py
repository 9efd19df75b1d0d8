"""Study (one-off). Question: does compressing from step 0 (no dense first step) shorten the time to accuracy?
Answer (testbed/results/first-step.md): "On a slow link the dense first step was most of the time to accuracy.
... TTA fell to 0.24-0.72x"; "At 50 Mbit the gain is 0.53-0.94x, at 200 Mbit level to 0.78x".
Run on: before 0249b69, after 0c0ea5e (as the results file records).

Before/after "no dense first step" (the change that compresses from step 0), paired on the same seeds.

Each cell (task x link x method x seed) runs twice back to back, once on the code before the change and once
after it (git worktrees of ``--before`` and ``--after``, each run with its worktree as the working directory
and first on the path: ``python -m`` puts the working directory first, so a run from this checkout would
import this checkout's package whatever PYTHONPATH says), in an order that alternates by seed, so both see
the same machine at the same moment. Per run: the time to the target (training seconds, target held 3 evaluations),
the steps to it, the dense steps and why, and the wire time of step 0. The table gives, per cell, the
before and after means and the geometric mean of after/before over the seeds; every run's record is in the
JSON, so each number can be recomputed from it.

    python testbed/studies/first_step.py --before <commit> --out runs/first-step   (root; ~1 hour on 2 cores)

Tasks: the tuning task (the digits MLP of testbed/grids/ci.yaml, 1.1M parameters) and evaluation set 1's
CNN on digits (testbed/grids/eval.yaml, 549k parameters). Methods: tta, TopK at 1% (error feedback) and
PowerSGD rank 4: before, torch's hook at its minimum startIter 2 (two dense steps); after, ours from step 0.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))  # testbed/studies/ -> the checkout
TASKS = {
    "tuning-mlp": {"model": "mlp", "hiddenSize": 1024, "dataset": "digits", "batchSize": 32, "lr": 0.05},
    "eval1-cnn": {"model": "cnn", "dataset": "digits", "batchSize": 32, "lr": 0.05},
}
RATES = ["10Mbit", "50Mbit", "200Mbit"]
# (before, after). The before side's code has no values field and sends topk and powersgd as fp32; the after
# side says fp32, as it did before one wire format (issue 62) made fp16 the default.
METHODS = {
    "tta": ({"method": "tta"}, {"method": "tta"}),
    "topk-0.01": ({"method": "topk", "density": 0.01}, {"method": "topk", "density": 0.01, "values": "fp32"}),
    "powersgd-r4": ({"method": "powersgd", "rank": 4, "startIter": 2},
                    {"method": "powersgd", "rank": 4, "values": "fp32"}),
}


def job(task: str, rate: str, compression: dict, seed: int) -> dict:
    training = {**TASKS[task], "seed": seed, "targetAccuracy": 0.93, "targetHold": 3, "stopAtTarget": True,
                "maxSeconds": "60s", "evalEvery": 1}
    return {"apiVersion": "netsense.dev/v1alpha1", "kind": "NetSenseJob", "metadata": {"name": "first-step"},
            "spec": {"workers": 2, "training": training, "compression": compression,
                     "network": {"profile": {"type": "static", "rate": rate}}}}


def run(src: str, doc: dict, out: str) -> dict:
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "job.yaml")
    with open(path, "w") as fh:
        yaml.safe_dump(doc, fh)
    env = {**os.environ, "PYTHONPATH": src}
    proc = subprocess.run([sys.executable, "-m", "netsense", "run", path, "--out", out, "--quiet"], env=env,
                          cwd=src, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        return {"status": "Failed", "reason": proc.stderr.strip().splitlines()[-1:]}
    with open(os.path.join(out, "result.json")) as fh:
        r = json.load(fh)
    with open(os.path.join(out, "timeline.csv")) as fh:
        header, first = fh.readline().strip().split(","), fh.readline().strip().split(",")
    step0 = dict(zip(header, first, strict=False))
    curve, target = r.get("accuracy_curve") or [], r["target_accuracy"]
    hold = r.get("target_hold", 3)
    steps = next((curve[i][0] for i in range(len(curve) - hold + 1)
                  if all(a >= target for _, _, a in curve[i:i + hold])), None)
    return {"status": r["status"], "tta_s": r["time_to_accuracy_s"], "steps": steps,
            "dense_steps": r.get("dense_steps", {"(not recorded)": r.get("dense_warmup_steps")}),
            "step0_comm_s": float(step0.get("comm_s") or 0), "step0_density": float(step0.get("density") or 1)}


def geomean(xs: list[float]) -> float | None:
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else None


def table(records: list[dict]) -> str:
    lines = ["| task | link | method | TTA before s | TTA after s | after/before (geo. mean; per seed) | "
             "steps before | steps after | step 0 wire before s | after s |",
             "| --- | --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
    cells = sorted({(r["task"], r["rate"], r["method"]) for r in records},
                   key=lambda c: (c[0], int(c[1][:-4]), c[2]))
    for task, rate, method in cells:
        mine = [r for r in records if (r["task"], r["rate"], r["method"]) == (task, rate, method)]
        pairs = [(r["before"]["tta_s"], r["after"]["tta_s"]) for r in mine]
        ratios = [a / b for b, a in pairs if a and b]

        def mean(side: str, key: str, mine: list[dict] = mine) -> str:
            xs = [r[side][key] for r in mine if r[side].get(key) is not None]
            return f"{statistics.fmean(xs):.2f}" if len(xs) == len(mine) else f"({len(xs)}/{len(mine)} reached)"

        g = geomean(ratios)
        per_seed = ", ".join(f"{x:.2f}" for x in ratios)
        lines.append(f"| {task} | {rate} | {method} | {mean('before', 'tta_s')} | {mean('after', 'tta_s')} | "
                     f"{'-' if g is None else f'{g:.2f}'} ({per_seed}) | {mean('before', 'steps')} | "
                     f"{mean('after', 'steps')} | {mean('before', 'step0_comm_s')} | {mean('after', 'step0_comm_s')} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True, help="the commit before the change")
    p.add_argument("--after", default="HEAD", help="the commit after it (default HEAD)")
    p.add_argument("--out", default="runs/first-step")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = p.parse_args()
    args.out = os.path.abspath(args.out)
    os.makedirs(args.out, exist_ok=True)
    sources = {}
    for side, commit in (("before", args.before), ("after", args.after)):
        sources[side] = tempfile.mkdtemp(prefix=f"netsense-{side}-")
        subprocess.run(["git", "-C", REPO, "worktree", "add", "--detach", sources[side], commit], check=True,
                       capture_output=True)
    commits = {side: subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], capture_output=True, text=True,
                                    check=True).stdout.strip() for side, src in sources.items()}
    records: list[dict] = []
    try:
        cells = [(t, r, m, s) for s in args.seeds for t in TASKS for r in RATES for m in METHODS]
        for i, (task, rate, method, seed) in enumerate(cells):
            old, new = METHODS[method]
            order = [("before", sources["before"], old), ("after", sources["after"], new)]
            if seed % 2:
                order.reverse()  # alternate which runs first
            rec = {"task": task, "rate": rate, "method": method, "seed": seed}
            for side, src, compression in order:
                rec[side] = run(src, job(task, rate, compression, seed),
                                os.path.join(args.out, f"{task}-{rate}-{method}-s{seed}-{side}"))
            records.append(rec)
            print(f"[{i + 1}/{len(cells)}] {task} {rate} {method} seed {seed}: TTA "
                  f"{rec['before'].get('tta_s')} -> {rec['after'].get('tta_s')} s", file=sys.stderr, flush=True)
            with open(os.path.join(args.out, "first-step.json"), "w") as fh:
                json.dump({**commits, "records": records}, fh, indent=1)
    finally:
        for src in sources.values():
            subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", src], capture_output=True)
    print(table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
