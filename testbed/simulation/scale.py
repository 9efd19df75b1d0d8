"""The scale studies' tables and plots (issue 65), printed from the committed per-seed records
(testbed/results/scale-*.jsonl), every one run on the simulated clock:

    .venv/bin/python testbed/simulation/scale.py paper   # the paper's setting: throughput, 8 workers
    .venv/bin/python testbed/simulation/scale.py growth  # time to accuracy as workers go 2 -> 64
    .venv/bin/python testbed/simulation/scale.py paper --plot testbed/results/scale-paper.png

The grids (testbed/grids/scale-*.yaml) say what each ran and why; testbed/EVALUATION.md reads the tables.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from netsense.bench import store  # noqa: E402

RESULTS = os.path.join(REPO, "testbed", "results")
PAPER = ("resnet18", "vgg16")
PAPER_METHODS = ("allreduce", "topk-0.1", "topk-0.01", "powersgd-r4", "netsense", "tta")
GROWTH = {"per-host 100 Mbit": "scale-growth", "shared 1 Gbit": "scale-growth-shared"}
GROWTH_METHODS = ("fp16", "topk-0.01", "powersgd-r4", "tta")


def _seeds(name: str) -> dict[tuple[str, str], list[dict]]:
    """(scenario, method) -> its per-seed records, from testbed/results/<name>."""
    path = os.path.join(RESULTS, name)
    if not store.exists(path):
        return {}
    return {(row["scenario"], row["method"]): row["per_seed"] for row in store.load(path)}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _fmt(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _number(scenario: str) -> int:
    return int(re.findall(r"\d+", scenario)[-1])


def paper_rows(model: str) -> list[dict]:
    """One row a link rate: each method's samples/s, and the paper's method's and tta's over the paper's baselines."""
    seeds = _seeds(f"scale-paper-{model}")
    rows = []
    for scenario in sorted({s for s, _ in seeds}, key=_number):
        tput = {m: _mean([r["throughput_samples_per_s"] for r in seeds[(scenario, m)]
                          if r.get("throughput_samples_per_s")])
                for m in PAPER_METHODS if (scenario, m) in seeds}
        density = {m: _mean([r["mean_density"] for r in seeds[(scenario, m)] if r.get("mean_density") is not None])
                   for m in ("netsense", "tta") if (scenario, m) in seeds}
        rows.append({"model": model, "mbit": _number(scenario), "samples_per_s": tput, "density": density})
    return rows


def _ratio(t: dict, a: str, b: str) -> str:
    return _fmt(t[a] / t[b], 2) + "x" if t.get(a) and t.get(b) else "-"


def print_paper() -> None:
    for model in PAPER:
        rows = paper_rows(model)
        if not rows:
            continue
        methods = [m for m in PAPER_METHODS if any(m in r["samples_per_s"] for r in rows)]
        print(f"\n{model}, 8 workers, an H200's compute (samples/s of the whole job; the paper's method's and tta's "
              "mean density)\n")
        print("| link | " + " | ".join(methods) + " | netsense / allreduce | netsense / topk-0.1 | tta / allreduce "
              "| tta / topk-0.1 | density: netsense, tta |")
        print("| ---: | " + " | ".join("---:" for _ in methods) + " | ---: | ---: | ---: | ---: | ---: |")
        for r in rows:
            t = r["samples_per_s"]
            dens = ", ".join(_fmt(r["density"].get(m), 4) for m in ("netsense", "tta"))
            print(f"| {r['mbit']} Mbit | " + " | ".join(_fmt(t.get(m)) for m in methods) +
                  f" | {_ratio(t, 'netsense', 'allreduce')} | {_ratio(t, 'netsense', 'topk-0.1')} | "
                  f"{_ratio(t, 'tta', 'allreduce')} | {_ratio(t, 'tta', 'topk-0.1')} | {dens} |")


def growth_rows(name: str) -> list[dict]:
    """One row a worker count: each method's time to the target (s, simulated) and steps."""
    seeds = _seeds(name)
    rows = []
    for scenario in sorted({s for s, _ in seeds}, key=_number):
        tta, steps = {}, {}
        for m in GROWTH_METHODS:
            runs = seeds.get((scenario, m), [])
            reached = [r for r in runs if r.get("time_to_accuracy_s") is not None]
            if runs and len(reached) == len(runs):
                tta[m] = _mean([r["time_to_accuracy_s"] for r in reached])
                steps[m] = _mean([r["steps_to_target"] for r in reached if r.get("steps_to_target") is not None])
            elif runs:
                tta[m] = math.inf
        rows.append({"workers": _number(scenario), "tta": tta, "steps": steps})
    return rows


def print_growth() -> None:
    for link, name in GROWTH.items():
        rows = growth_rows(name)
        if not rows:
            continue
        print(f"\n{link} ({name}): seconds to the target on the simulated clock (steps), fastest in bold\n")
        print("| workers | " + " | ".join(GROWTH_METHODS) + " | TopK 1% / PowerSGD r4 |")
        print("| ---: | " + " | ".join("---:" for _ in GROWTH_METHODS) + " | ---: |")
        for r in rows:
            finite = {m: v for m, v in r["tta"].items() if math.isfinite(v)}
            best = min(finite, key=finite.get) if finite else None
            cells = []
            for m in GROWTH_METHODS:
                v = r["tta"].get(m)
                text = "missed" if v == math.inf else "-" if v is None else f"{v:.2f} ({r['steps'].get(m, 0):.0f})"
                cells.append(f"**{text}**" if m == best else text)
            tk, ps = r["tta"].get("topk-0.01"), r["tta"].get("powersgd-r4")
            ratio = _fmt(tk / ps, 2) + "x" if tk and ps and math.isfinite(tk) and math.isfinite(ps) else "-"
            print(f"| {r['workers']} | " + " | ".join(cells) + f" | {ratio} |")


def plot(kind: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if kind == "paper":
        fig, axes = plt.subplots(1, len(PAPER), figsize=(11, 4))
        for ax, model in zip(axes, PAPER, strict=True):
            rows = paper_rows(model)
            for m in PAPER_METHODS:
                pts = [(r["mbit"], r["samples_per_s"][m]) for r in rows if r["samples_per_s"].get(m)]
                if pts:
                    ax.plot(*zip(*pts, strict=True), marker="o", label=m, color=f"C{PAPER_METHODS.index(m)}")
            ax.set(xscale="log", yscale="log", xlabel="per-host link (Mbit/s)", ylabel="samples/s (8 workers)",
                   title=f"{model}, H200 compute, simulated clock")
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=8)
        axes[1].legend(fontsize=8)
    else:
        links = [(link, name) for link, name in GROWTH.items() if growth_rows(name)]  # the ones run so far
        fig, axes = plt.subplots(1, len(links), figsize=(5.5 * len(links), 4), squeeze=False)
        axes = axes[0]
        for ax, (link, name) in zip(axes, links, strict=True):
            rows = growth_rows(name)
            for m in GROWTH_METHODS:
                pts = [(r["workers"], r["tta"][m]) for r in rows if math.isfinite(r["tta"].get(m, math.inf))]
                if pts:
                    ax.plot(*zip(*pts, strict=True), marker="o", label=m, color=f"C{GROWTH_METHODS.index(m)}")
            ax.set(xscale="log", yscale="log", xlabel="workers (one global batch of 256)",
                   ylabel="seconds to 93% (simulated)", title=f"digits MLP, {link}")
            ax.set_xticks([2, 4, 8, 16, 32, 64], labels=["2", "4", "8", "16", "32", "64"])
            ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    print(f"wrote {path}", file=sys.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("study", choices=("paper", "growth"))
    ap.add_argument("--plot", metavar="PNG", help="also draw the study's plot there")
    args = ap.parse_args()
    print_paper() if args.study == "paper" else print_growth()
    if args.plot:
        plot(args.study, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
