"""Per-step timeline, the result summary (result.json's keys), and the plot."""

from __future__ import annotations

import csv
import itertools
import json
import os
from dataclasses import dataclass, field

TIMELINE_COLUMNS = ["time", "step", "epoch", "loss", "density", "lowrank_rank", "bytes", "comm_s", "compute_s",
                    "selection_s", "est_btlbw_mbit", "est_rtprop_ms", "link_rate_mbit", "samples_per_s", "dense_reason",
                    "probe", "accuracy"]


@dataclass
class Timeline:
    rows: list[dict] = field(default_factory=list)

    def add(self, **row) -> None:
        self.rows.append(row)

    def write_csv(self, path: str) -> None:
        with open(path, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=TIMELINE_COLUMNS, extrasaction="ignore")
            w.writeheader()
            for r in self.rows:
                w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in TIMELINE_COLUMNS})

    def steady_throughput(self, samples_per_step: int) -> float:
        """Global samples/s over the steps after warm-up (first 10%, at least 2 steps)."""
        if len(self.rows) < 3:
            return 0.0
        skip = max(2, len(self.rows) // 10)
        first, last = self.rows[skip - 1], self.rows[-1]
        dt = last["time"] - first["time"]
        return samples_per_step * (len(self.rows) - skip) / dt if dt > 0 else 0.0


# A job's target (spec.training): the metric its evaluations are read by and the field that sets it. One of them
# at most (the spec refuses both).
TARGET_FIELDS = {"accuracy": "targetAccuracy", "loss": "targetLoss"}


def job_target(training: dict) -> tuple[str, float] | None:
    """(metric, value) of spec.training's target: ("accuracy", targetAccuracy), ("loss", targetLoss), or None."""
    return next(((m, training[f]) for m, f in TARGET_FIELDS.items() if training.get(f) is not None), None)


def result_target(result: dict) -> tuple[str, float] | None:
    """(metric, value) of the target a result's run was held to: its ``target_metric`` (a result written before
    loss targets has none: its target is ``target_accuracy``)."""
    metric = result.get("target_metric") or "accuracy"
    value = result.get(f"target_{metric}")
    return None if value is None else (metric, value)


def evaluated(result: dict, metric: str, which: str = "best") -> float | None:
    """A result's ``which`` (best or final) evaluation of ``metric``: best_accuracy / final_accuracy, or for a loss
    best_eval_loss / final_eval_loss (the evaluations' loss, not the last training batch's final_loss)."""
    return result.get(f"{which}_{'accuracy' if metric == 'accuracy' else 'eval_loss'}")


def reaches(metric: str, value: float, target: float) -> bool:
    """Whether an evaluation's ``value`` of ``metric`` meets ``target``: an accuracy at or above it, a loss at or
    below it."""
    return value >= target if metric == "accuracy" else value <= target


def curve_of(result: dict, metric: str) -> list:
    """The result's [step, seconds, value] evaluations of ``metric``: accuracy_curve or loss_curve."""
    return result.get(f"{metric}_curve") or []


TEXT_COLUMNS = ("dense_reason",)  # the timeline's columns that are words, not numbers


def read_timeline(path: str) -> list[dict]:
    def value(k: str, v: str | None):
        return None if v in ("", None) else v if k in TEXT_COLUMNS else float(v)

    with open(path) as fh:
        return [{k: value(k, v) for k, v in r.items()} for r in csv.DictReader(fh)]


def write_result(out_dir: str, result: dict) -> str:
    path = os.path.join(out_dir, "result.json")
    with open(path, "w") as fh:
        json.dump(result, fh, indent=2, sort_keys=True)
        fh.write("\n")
    return path


def compact(result: dict, limit: int = 4000) -> str:
    """The result as one JSON line that fits a termination message (4096 bytes)."""
    text = json.dumps(result, separators=(",", ":"), sort_keys=True)
    if len(text) <= limit:
        return text
    keep = {k: v for k, v in result.items() if not isinstance(v, (list, dict))}
    return json.dumps(keep, separators=(",", ":"), sort_keys=True)[:limit]


def _link_label(dev: str) -> str:
    """A shaped device, in words: the emulated cluster's h<i> (rank i's link), up0/up1 (the shared link, each
    way), a pod's eth0 (egress) and ifb (ingress)."""
    if dev.startswith("h") and dev[1:].split("-")[0].isdigit():
        rank = dev[1:].split("-")[0]
        return f"rank {rank}'s link, {'down' if dev.endswith('-down') else 'up'} ({dev})"
    return {"up0": "shared link, rack A to B (up0)", "up1": "shared link, rack B to A (up1)",
            "eth0": "the pod's egress (eth0)", "ifb-eth0": "the pod's ingress (ifb-eth0)"}.get(dev, dev)


def plot(timeline_csv: str, png_path: str, title: str = "", queue: list[dict] | None = None,
         cross: list[dict] | None = None, result: dict | None = None) -> str | None:
    """samples/s, density (dense steps and probes marked), the link (its rate, the sensed bandwidth, the
    training's and the cross traffic's rates) and accuracy (the target and the time to it, from ``result``) over
    the training clock; with ``queue`` (queue.csv's rows) each shaped link's queueing delay too. Legends sit
    beside the panels, never on a curve."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = read_timeline(timeline_csv)
    if not rows:
        return None
    result = result or {}
    t = [r["time"] for r in rows]
    panels = 5 if queue else 4
    fig, axes = plt.subplots(panels, 1, figsize=(10, 2.25 * panels), sharex=True)

    def legend(ax) -> None:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)

    axes[0].plot(t, [r["samples_per_s"] for r in rows], lw=0.8)
    axes[0].set_ylabel("samples/s")
    axes[1].plot(t, [r["density"] for r in rows], lw=0.8, color="tab:orange", label="density (fraction sent)")
    for reason, marker in (("controller", "x"), ("warm-up", "s"), ("method", "")):
        dense = [(r["time"], r["density"]) for r in rows if r.get("dense_reason") == reason]
        if dense and marker:
            axes[1].scatter(*zip(*dense, strict=True), marker=marker, s=14, color="black",
                            label=f"dense step ({reason})", zorder=3)
    probes = [(r["time"], r["density"]) for r in rows if r.get("probe")]
    if probes:
        axes[1].scatter(*zip(*probes, strict=True), marker="^", s=12, color="tab:green", label="probe", zorder=3)
    axes[1].set_ylabel("density")
    axes[1].set_yscale("log")
    legend(axes[1])
    link = [(r["time"], r["link_rate_mbit"]) for r in rows if r["link_rate_mbit"] is not None]
    if link:
        axes[2].plot(*zip(*link, strict=True), lw=1.2, label="link rate (the profile)", color="black")
    est = [(r["time"], r["est_btlbw_mbit"]) for r in rows if r["est_btlbw_mbit"]]
    if est:
        axes[2].plot(*zip(*est, strict=True), lw=0.8, label="bandwidth the controller sensed (BtlBw)",
                     color="tab:green")
    if queue or cross:  # who got the bandwidth: the training's own wire rate beside the cross traffic
        wire = [(b["time"], b["bytes"] * 8 / (b["time"] - a["time"]) / 1e6) for a, b in itertools.pairwise(rows)
                if b["bytes"] is not None and b["time"] > a["time"]]
        if wire:
            axes[2].plot(*zip(*wire, strict=True), lw=0.6, label="training (wire bytes / step)", color="tab:blue")
    if cross:
        total: dict[float, float] = {}
        for r in cross:
            total[float(r["t"])] = total.get(float(r["t"]), 0.0) + float(r["mbit"])
        axes[2].plot(*zip(*sorted(total.items()), strict=True), lw=0.8, label="cross traffic", color="tab:purple")
    axes[2].set_ylabel("Mbit/s")
    axes[2].set_ylim(bottom=0)  # an estimate reads against the link, not against its own wiggle
    if link or est or queue or cross:
        legend(axes[2])
    acc = [(r["time"], r["accuracy"]) for r in rows if r["accuracy"] is not None]
    if acc:
        axes[3].plot(*zip(*acc, strict=True), marker="o", ms=3, color="tab:red", label="test accuracy")
    target, tta = result_target(result), result.get("time_to_accuracy_s")
    if target is not None:
        if target[0] == "accuracy":  # this panel's axis; a loss target is marked by when it was reached
            axes[3].axhline(target[1], color="gray", lw=0.8, ls="--",
                            label=f"target {target[1]} (held {result.get('target_hold', 3)} evaluations)")
        else:
            axes[3].plot([], [], " ", label=f"target: loss {target[1]} (held {result.get('target_hold', 3)} "
                                            "evaluations)")
        if tta is not None:
            for ax in axes:
                ax.axvline(tta, color="tab:red", lw=0.6, ls=":")
            axes[3].plot([], [], color="tab:red", lw=0.6, ls=":", label=f"target reached: {tta:.2f} s")
        else:
            axes[3].plot([], [], " ", label="target not reached")
    axes[3].set_ylabel("accuracy")
    if acc or target is not None:
        legend(axes[3])
    if queue:
        for dev in sorted({r["dev"] for r in queue}):
            pts = [(float(r["t"]), float(r["queue_delay_ms"])) for r in queue
                   if r["dev"] == dev and r["queue_delay_ms"]]
            if pts:
                axes[4].plot(*zip(*pts, strict=True), lw=0.6, label=_link_label(dev))
        axes[4].set_ylabel("queueing delay (ms)")
        legend(axes[4])
    axes[-1].set_xlabel("training time (s)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(png_path, dpi=90)
    plt.close(fig)
    return png_path


def summary_lines(result: dict) -> list[str]:
    """What a run did, for a terminal: the outcome, the target (reached or not, and the rule), speed and bytes,
    and the bottleneck (queue, drops, cross traffic) where it was observed."""
    def fmt(x, spec: str = ".3f") -> str:
        return "-" if x is None else format(x, spec)

    target, reached = result_target(result), result.get("target_reached")
    outcome = result.get("status") + (", target missed" if target is not None and reached is False else
                                      ", target reached" if reached else "")
    lines = [f"{result.get('job')}: {outcome}, {result.get('method')} on {result.get('workers')} "
             f"workers, {result.get('steps')} steps ({fmt(result.get('train_seconds'), '.1f')} s of training, "
             f"{fmt(result.get('wall_seconds'), '.1f')} s wall)"]
    if target is not None:
        hold = result.get("target_hold", 3)
        tta = result.get("time_to_accuracy_s")
        lines.append(f"  target {target[0]} {target[1]}: " + (
            f"reached at {tta:.2f} s of training (held {hold} evaluations)" if tta is not None else
            f"NOT reached (held {hold} evaluations in a row needed)") + f"; best {target[0]} "
            f"{fmt(evaluated(result, target[0]))}, final {fmt(evaluated(result, target[0], 'final'))}")
    steps = result.get("steps") or 0
    per_step = result.get("bytes_sent_per_worker", 0) / steps / 1e3 if steps else None
    lines.append(f"  {fmt(result.get('throughput_samples_per_s'), '.0f')} samples/s, mean density "
                 f"{fmt(result.get('mean_density'), '.4f')}, {fmt(per_step, '.1f')} kB a step a worker, link "
                 f"{fmt(result.get('link_mean_rate_mbit'), 'g')} Mbit/s (mean)"
                 + (f", dense steps {result['dense_steps']}" if result.get("dense_steps") else ""))
    bottleneck = result.get("bottleneck") or {}
    for label, link in (bottleneck.get("links") or {}).items():
        lines.append(f"  link {label}: queueing delay p99 {fmt(link.get('queue_delay_p99_ms'), '.1f')} ms, max "
                     f"{fmt(link.get('queue_delay_max_ms'), '.1f')} ms, {link.get('drops', 0)} drops")
    for name, flow in (bottleneck.get("cross_traffic") or {}).items():
        lines.append(f"  cross traffic {name}: {fmt(flow.get('mean_mbit_when_on'), '.1f')} Mbit/s while on")
    lines += [f"  warning: {w}" for w in result.get("warnings") or []]
    return lines
