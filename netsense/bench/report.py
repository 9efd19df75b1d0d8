"""Rows -> summary.md and the plots."""

from __future__ import annotations

import math
import os


def fmt(v, digits=2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return "inf" if math.isinf(v) else f"{v:.{digits}f}"
    return str(v)


def interval(ratio: float, lo: float | None, hi: float | None) -> str:
    """'0.91 [0.85, 0.97]', or '0.91 (no interval below 5 seeds)'."""
    return f"{ratio:.2f} [{lo:.2f}, {hi:.2f}]" if lo is not None else f"{ratio:.2f} (no interval: < 5 seeds)"


def paired(row: dict) -> str:
    """'0.91 [0.85, 0.97] vs topk-0.01 (n=10)', or '-' without common seeds."""
    if row.get("paired_ratio") is None:
        return "-"
    return f"{interval(row['paired_ratio'], row['ratio_lo'], row['ratio_hi'])} vs {row['vs']} (n={row['pairs']})"


def _families(grid: dict) -> str:
    named = grid.get("variants") or {}
    if not named:
        return "none named in this grid"
    return "; ".join(f"{head} with {', '.join(members)}" for head, members in named.items())


def calibrated(rows: list[dict]) -> bool:
    """Whether any row's runs used a penalties profile (stats: its calibration columns)."""
    return any("tta_charged_mean_s" in r for r in rows)


def _calibration_legend() -> str:
    from netsense.bench.stats import AMORTIZED_OVER

    return (f"Calibration (issue 66): a method whose runs used a penalties profile (tta's compression.penalties, "
            f"made by netsense calibrate) is charged what the calibration cost, in full, to every run it served: "
            f"calibration s = the profile's cost (the training seconds of the calibration's raced runs, on the "
            f"clock named: simulated, at the calibration's own given inputs; wall = an older profile that recorded "
            f"only its wall seconds; unrecorded = none, nothing charged); with calibration = time to target + "
            f"that cost; amortized = time to target + cost / {AMORTIZED_OVER} (one calibration shared by "
            f"{AMORTIZED_OVER} runs of the same model). A grid that gives one profile to all its cells charges it "
            f"in full to each seed's cell. For such a method regret, the paired comparison (and the choice of the "
            f"best other), wins, the further targets and the sensitivity ratios use the charged time; time to "
            f"target and ± are its own, uncharged. A method without a profile: its own time in every column.")


def _calibration_cells(r: dict) -> str:
    """' with calibration | ± | amortized | calibration s (clock) |' cells of a row (its own time where it used no
    profile)."""
    if "tta_charged_mean_s" not in r:
        return f" {fmt(r['tta_mean_s'])} | {fmt(r['tta_std_s'])} | {fmt(r['tta_mean_s'])} | none |"
    cost = f"{fmt(r.get('calibration_s'), 1)} ({r.get('calibration_clock')})"
    return (f" {fmt(r['tta_charged_mean_s'])} | {fmt(r.get('tta_charged_std_s'))} | "
            f"{fmt(r.get('tta_amortized_mean_s'))} | {cost} |")


def _exposure(rows: list[dict]) -> list[str]:
    """The contention-matched ceiling's table (stats.matched_ceiling), where the grid measured it."""
    rows = [r for r in rows if r.get("ceiling_samples_per_s")]
    if not rows:
        return []
    return ["| method | ceiling (its twins') | ceiling samples/s | x ceiling | exposed network ms/step | wire ms/step "
            "| exposed / wire |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: |"] + [
        f"| {r['method']} | {r['ceiling_from']} | {fmt(r['ceiling_samples_per_s'], 0)} | "
        f"{fmt(r.get('ratio_to_ceiling'))} | "
        f"{fmt(r.get('exposed_ms'), 1)} | {fmt(r.get('wire_ms'), 1)} | {fmt(r.get('exposed_over_wire'))} |"
        for r in rows] + [""]


def _target_words(training: dict) -> str:
    """The grid's target in words: an accuracy, or a loss (the evaluations' mean cross-entropy)."""
    if training.get("targetLoss") is not None:
        return f"Target loss {training['targetLoss']} (the evaluations' mean cross-entropy, at or below)"
    return f"Target accuracy {training.get('targetAccuracy')}"


def markdown(name: str, rows: list[dict], grid: dict, ceiling: float | None = None,
             ceilings: list[float] | None = None, source: str = "", varied: list[dict] | None = None) -> str:
    t = grid.get("base", {}).get("training", {})
    order = ("in a shuffled, interleaved order" if grid.get("order", "shuffled") == "shuffled"
             else "in the grid's order (method by method)")
    lines = [f"# Benchmark: {name}", "", f"{source} Cells ran {order} in one invocation.".strip(), "",
             f"{_target_words(t)} for every method, reached when held "
             f"{t.get('targetHold', 3)} evaluations in a row (the time to target: the first of them); budget "
             f"{t.get('maxSeconds') or t.get('maxSteps') or t.get('epochs')} ; seeds {grid.get('seeds', [0])}. "
             "Time to target = training seconds to the target (mean ± std over seeds; '-' = not reached by every seed "
             "within the budget). Failed = runs that ended in an error (each listed under its table with the "
             "reason; they count as not reached, and the other columns are means over the runs that finished). "
             "Regret = time to target / the best in the scenario. Paired = the geometric mean over "
             "common seeds of time to target / the best other method's (named; a method's own variants are not "
             f"its peers: {_families(grid)}), with its 95% t interval on the log ratios (from 5 seeds): a "
             "method leads only where the interval is below 1; wins = the share of seeds on which it was the "
             "fastest of all; (best fixed) marks the fixed TopK density of the sweep with the lowest mean time to target "
             "(the hindsight-best fixed density). x allreduce = samples/s over allreduce's on the same link "
             "(the paper's headline measure). Steps = training steps to the "
             "target (accuracy per step, apart from speed). Queue p99 = the p99 queueing delay of the run's "
             "worst shaped link (time-weighted, so a method's few large steps weigh in), step queue = the median "
             "over steps of each step's worst queueing delay, drops = packets the queues dropped, cross = the "
             "cross traffic's goodput while on (Mbit/s): what the method did to the bottleneck.", ""]
    if calibrated(rows):
        lines += [_calibration_legend(), ""]
    if ceiling:
        each = f" (before and after the cells: {' and '.join(f'{c:.0f}' for c in ceilings)})" \
            if ceilings and len(ceilings) > 1 else ""
        lines += [f"No-communication ceiling, measured in the same run: {ceiling:.0f} samples/s{each}; "
                  "one worker alone, times the number of workers.", ""]
    if grid.get("ceiling") == "matched":
        lines += ["Contention-matched ceiling (`ceiling: matched`): each cell ran again without the wire, interleaved "
                  "among the cells (both workers run the whole hook path; every collective moves no bytes: "
                  "netsense.compression.communicator), and x ceiling is the method's samples/s over its twins'; "
                  "an adaptive method (its steps depend on the link it senses) is read against the twins of the "
                  "fixed TopK density nearest its mean density. "
                  "Under each table: the network time a step left exposed (its step time less its twin's) "
                  "against the wire time of the bytes it sent at the link's median rate.", ""]
    for scenario in sorted({r["scenario"] for r in rows}):
        charge = calibrated([r for r in rows if r["scenario"] == scenario])
        lines += [f"## {scenario}", "",
                  "| method | time to target s | ± |"
                  + (" with calibration s | ± | amortized s | calibration s |" if charge else "")
                  + " regret | paired vs best other [95% CI] | wins | reached | failed | steps "
                  "| samples/s "
                  "| x allreduce | x ceiling | best acc | final acc "
                  "| density | MB/step | selection ms | queue p99 ms | step queue ms | drops | cross Mbit/s |",
                  "| --- | ---: | ---: |" + (" ---: | ---: | ---: | ---: |" if charge else "")
                  + " ---: | ---: | ---: | :---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
                  "| ---: "
                  "| ---: "
                  "| ---: | ---: | ---: | ---: |"]
        sweep = [r for r in rows if r["scenario"] == scenario and r["method"].startswith("topk-")
                 and r["tta_mean_s"] is not None]
        best_fixed = min(sweep, key=lambda r: r["tta_mean_s"])["method"] if len(sweep) > 1 else None
        for r in rows:
            if r["scenario"] == scenario:
                label = f"{r['method']} (best fixed)" if r["method"] == best_fixed else r["method"]
                lines.append(f"| {label} | {fmt(r['tta_mean_s'])} | {fmt(r['tta_std_s'])} |"
                             + (_calibration_cells(r) if charge else "") + " "
                             f"{fmt(r['regret'])} | {paired(r)} | {fmt(r.get('wins'))} | {r['reached']} | {r.get('failed', 0)} | {fmt(r.get('steps_to_target'), 0)} | "
                             f"{fmt(r['samples_per_s'], 0)} | {fmt(r.get('x_allreduce'))} | "
                             f"{fmt(r.get('ratio_to_ceiling'))} | "
                             f"{fmt(r['best_accuracy'], 3)} | {fmt(r['final_accuracy'], 3)} | "
                             f"{fmt(r['mean_density'], 4)} | "
                             f"{fmt(r['bytes_per_step'] / 1e6 if r['bytes_per_step'] is not None else None, 3)} | "
                             f"{fmt(r['selection_ms'], 1)} | {fmt(r.get('queue_p99_ms'), 1)} | "
                             f"{fmt(r.get('step_queue_ms'), 1)} | "
                             f"{fmt(r.get('drops'), 0)} | {fmt(r.get('cross_mbit'), 1)} |")
        lines.append("")
        failures = [(r["method"], f) for r in rows if r["scenario"] == scenario for f in r.get("failures", [])]
        if failures:
            lines += ["Failed runs:", ""] + [f"- {method}, seed {f['seed']}: {' '.join(str(f['reason']).split())}"
                                             for method, f in failures] + [""]
        lines += _exposure([r for r in rows if r["scenario"] == scenario])
        lines += _readings(grid, [r for r in rows if r["scenario"] == scenario])
    if varied:
        lines += _sensitivity(varied, calibrated(rows))
    return "\n".join(lines)


def _sensitivity(varied: list[dict], charge: bool = False) -> list[str]:
    """One constant at a time: each variant's time to the target over the method's own, same seeds."""
    lines = ["## Sensitivity", "",
             "One constant changed at a time, everything else at the method's settings. Ratio = the geometric "
             "mean over common seeds of the variant's time to target / the method's own, with its 95% t interval on the "
             "log ratios (from 5 seeds; above 1: slower); Holm = still significant at 5% when every row of this "
             "table is counted (Holm's correction): an interval that excludes 1 on its own is one comparison of "
             "many; reached = seeds that reached the target within the budget (a seed either never reached is "
             "censored and not in the ratio)." + (" A run that used a penalties profile is charged its calibration "
                                                  "in full, in the ratio and in the times." if charge else ""), "",
             "| scenario | method | constant | value | time-to-target ratio [95% CI] | Holm | n | reached | method reached "
             "| time to target s | method's time to target s |",
             "| --- | --- | --- | ---: | ---: | :---: | ---: | :---: | :---: | ---: | ---: |"]
    for v in sorted(varied, key=lambda v: (v["scenario"], v["method"], v["constant"], str(v["value"]))):
        ratio = "-" if v["ratio"] is None else interval(v["ratio"], v["ratio_lo"], v["ratio_hi"])
        holm = {True: "yes", False: "no", None: "-"}[v.get("holm")]
        lines.append(f"| {v['scenario']} | {v['method']} | {v['constant']} | {v['value']} | {ratio} | {holm} | "
                     f"{v['pairs']} | {v['reached']} | {v['method_reached']} | {fmt(v['tta_mean_s'])} | "
                     f"{fmt(v['method_tta_mean_s'])} |")
    return lines + [""]


def sensitivity_plot(out_dir: str, varied: list[dict]) -> list[str]:
    """sensitivity.png: per scenario, each variant's time-to-target ratio with its interval (log scale; 1 = no change)."""
    if not varied:
        return []
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    scenarios = sorted({v["scenario"] for v in varied})
    variants = sorted({v["variant"] for v in varied})
    fig, axes = plt.subplots(1, len(scenarios), figsize=(4.2 * len(scenarios), 0.22 * len(variants) + 1.2),
                             squeeze=False, sharey=True)
    for ax, scenario in zip(axes[0], scenarios, strict=True):
        for y, name in enumerate(variants):
            v = next((x for x in varied if x["scenario"] == scenario and x["variant"] == name), None)
            if v is None or v["ratio"] is None:
                ax.text(1, y, "x", ha="center", va="center", color="red")
                continue
            if v["ratio_lo"] is None:  # too few seeds for an interval: the point alone
                ax.plot(v["ratio"], y, "o", ms=3, color="tab:gray")
                continue
            ax.errorbar(v["ratio"], y, xerr=[[v["ratio"] - v["ratio_lo"]], [v["ratio_hi"] - v["ratio"]]],
                        fmt="o", ms=3, color="tab:blue", capsize=2)
        ax.axvline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.set_yticks(range(len(variants)), variants, fontsize=6)
        ax.set_title(scenario, fontsize=9)
        ax.set_xlabel("time to target / the method's own (log)", fontsize=8)
    fig.tight_layout()
    path = os.path.join(out_dir, "sensitivity.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return [path]


def _readings(grid: dict, rows: list[dict]) -> list[str]:
    """The further targets and the accuracy after equal epochs, read off the same runs' accuracy curves."""
    targets, epochs = grid.get("targets", []), grid.get("accuracyAfterEpochs")
    if not targets and not epochs:
        return []
    head = "| method |" + "".join(f" time to {t} s | ± | paired vs best other [95% CI] | reached |" for t in targets)
    rule = "| --- |" + " ---: | ---: | ---: | :---: |" * len(targets)
    if epochs:
        head += f" accuracy after {epochs:g} epochs | ± | seeds |"
        rule += " ---: | ---: | :---: |"
    lines = ["Further readings of the same runs (each run's accuracy curve, its loss curve for a loss target; the "
             "target held the same number of evaluations; accuracy after equal epochs: the last evaluation within "
             "them, over the seeds that trained that long):", "", head, rule]
    for r in rows:
        line = f"| {r['method']} |"
        for t in targets:
            e = r["targets"][str(t)]
            mean = fmt(e["tta_mean_s"]) + (f" (with calibration {fmt(e.get('tta_charged_mean_s'))})"
                                           if "tta_charged_mean_s" in e else "")
            line += f" {mean} | {fmt(e['tta_std_s'])} | {paired(e)} | {e['reached']} |"
        if epochs:
            a = r["after_epochs"]
            line += f" {fmt(a['mean'], 3)} | {fmt(a['std'], 3)} | {a['n']} |"
        lines.append(line)
    return lines + [""]


def plots(out_dir: str, rows: list[dict], results: list[dict]) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    from netsense.train.results import read_timeline

    made = []
    scenarios = sorted({r["scenario"] for r in rows})
    methods = sorted({r["method"] for r in rows})
    colors = {m: f"C{i % 10}" for i, m in enumerate(methods)}
    # Time to accuracy: every seed a point, the mean a bar; a method's paired ratio and interval beside it.
    fig, axes = plt.subplots(1, len(scenarios), figsize=(6.0 * len(scenarios), 0.38 * len(methods) + 1.6),
                             squeeze=False, sharey=True)
    for ax, scenario in zip(axes[0], scenarios, strict=True):
        for y, m in enumerate(methods):
            row = next((r for r in rows if r["scenario"] == scenario and r["method"] == m), None)
            if row is None:
                continue
            ttas = [s["time_to_accuracy_s"] for s in row.get("per_seed", []) if s.get("time_to_accuracy_s")]
            ax.scatter(ttas, [y] * len(ttas), s=10, color=colors[m], alpha=0.7)
            if row["tta_mean_s"] is not None:
                ax.plot([row["tta_mean_s"]] * 2, [y - 0.3, y + 0.3], color="black", lw=1.5)
            if row.get("tta_charged_mean_s") is not None:  # its calibration charged in full: what it is compared by
                ax.plot([row["tta_charged_mean_s"]] * 2, [y - 0.3, y + 0.3], color="red", lw=1.5, ls="--")
            ax.text(1.01, y, paired(row).split(" (n=")[0] if row.get("paired_ratio") else
                    f"reached {row['reached']}", transform=ax.get_yaxis_transform(), fontsize=6, va="center")
        ax.set_yticks(range(len(methods)), methods, fontsize=7)
        ax.set_xlabel("time to target (s): seeds, and their mean" + (
            "; dashed red: the mean with the calibration charged" if calibrated(rows) else ""), fontsize=8)
        ax.set_title(scenario, fontsize=9)
    fig.tight_layout()
    path = os.path.join(out_dir, "time_to_target.png")  # not tta.png: tta is a method's name
    fig.savefig(path, dpi=90)
    plt.close(fig)
    made.append(path)
    made += accuracy_plot(out_dir, rows, results, scenarios, methods, colors)
    # Density against link rate over time, first seed of each method, per scenario.
    fig, axes = plt.subplots(len(scenarios), 1, figsize=(8, 2.4 * len(scenarios)), squeeze=False)
    for ax, scenario in zip(axes[:, 0], scenarios, strict=True):
        link_drawn = False
        twin = ax.twinx()
        for r in results:
            if r["scenario"] != scenario or r.get("timeline") is None or r["seed"] != min(
                    x["seed"] for x in results if x["scenario"] == scenario):
                continue
            rows_t = read_timeline(r["timeline"])
            ax.plot([x["time"] for x in rows_t], [x["density"] for x in rows_t], lw=0.8, label=r["method_label"])
            if not link_drawn:
                twin.plot([x["time"] for x in rows_t], [x["link_rate_mbit"] for x in rows_t], color="black", lw=1.5)
                link_drawn = True
        ax.set_yscale("log")
        ax.set_ylabel("density")
        twin.set_ylabel("link Mbit/s")
        ax.set_title(scenario, fontsize=9)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6, ncol=4)
    axes[-1, 0].set_xlabel("training time (s)")
    fig.tight_layout()
    path = os.path.join(out_dir, "density_vs_link.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    made.append(path)
    return made


def accuracy_plot(out_dir: str, rows: list[dict], results: list[dict], scenarios: list[str], methods: list[str],
                  colors: dict[str, str]) -> list[str]:
    """Accuracy against training time, per method: the mean over seeds and the band from the lowest to the
    highest seed (each seed's accuracy holds from one evaluation to the next), the target as a line."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(scenarios), figsize=(4.6 * len(scenarios), 3.4), squeeze=False)
    for ax, scenario in zip(axes[0], scenarios, strict=True):
        curves = [r for r in results if r["scenario"] == scenario and r.get("accuracy_curve")]
        if not curves:
            continue
        end = max(c[1] for r in curves for c in r["accuracy_curve"])
        grid = [end * i / 200 for i in range(201)]
        for m in methods:
            seeds = [r["accuracy_curve"] for r in curves if r["method_label"] == m]
            if not seeds:
                continue
            held = [[next((a for _, t, a in reversed(curve) if t <= x), None) for x in grid] for curve in seeds]
            at = [(x, [h[i] for h in held if h[i] is not None]) for i, x in enumerate(grid)]
            at = [(x, v) for x, v in at if len(v) == len(seeds)]  # where every seed has been evaluated
            if not at:
                continue
            xs = [x for x, _ in at]
            ax.plot(xs, [sum(v) / len(v) for _, v in at], color=colors[m], lw=1, label=m)
            ax.fill_between(xs, [min(v) for _, v in at], [max(v) for _, v in at], color=colors[m], alpha=0.15)
        target = next((r.get("target_accuracy") for r in curves if r.get("target_accuracy")), None)
        if target:
            ax.axhline(target, color="gray", ls="--", lw=0.8)
        ax.set_title(scenario, fontsize=9)
        ax.set_xlabel("training time (s)", fontsize=8)
    axes[0][0].set_ylabel("test accuracy (mean, band: all seeds)")
    if axes[0][-1].get_legend_handles_labels()[0]:
        axes[0][-1].legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    path = os.path.join(out_dir, "accuracy.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return [path]
