"""The grid file -> cells: one NetSenseJob per method x scenario x seed (the format: netsense.bench)."""

from __future__ import annotations

import copy
import hashlib
import os
from dataclasses import dataclass

from netsense.spec import API_VERSION, KIND, SpecError, parse_job
from netsense.spec.job import REMOVED_AT, REMOVED_TTA, VALUES_DEFAULT, read_yaml
from netsense.spec.schema import Issue

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The registered evaluation sets and the grids the README cites at the top; development grids (dev-*) below.
GRID_FOLDERS = ("testbed/grids", "testbed/grids/dev")


def grid_path(name: str) -> str | None:
    """testbed/grids[/dev]/<name>.yaml, repo-relative, or None where neither holds it."""
    for folder in GRID_FOLDERS:
        path = f"{folder}/{name}.yaml"
        if os.path.isfile(os.path.join(REPO, path)):
            return path
    return None


@dataclass(frozen=True)
class Cell:
    method: str
    scenario: str
    seed: int
    job: dict  # a full NetSenseJob document
    # Settings its method ran with that tta has since lost (REMOVED_TTA), left out of ``job`` (a grid with
    # ``ranAt``: read, never run here)
    removed: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.method}--{self.scenario}--s{self.seed}"


def merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def _dns(text: str) -> str:
    """A DNS-1123 name for a cell's job; a long one keeps a digest of the rest, so two never collide."""
    name = "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")
    if len(name) <= 50:
        return name
    return f"{name[:41].rstrip('-')}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"


SCENARIO_KEYS = ("network", "workers", "training")
SCENARIO_TRAINING = ("batchSize",)  # strong scaling: one global batch split over the scenario's workers


def _scenario(name: str, setting) -> dict:
    """A profile (a mapping with a type), or a scenario: a whole spec.network, another worker count and/or another
    batch a worker (the task is otherwise the grid's)."""
    if not isinstance(setting, dict) or "type" in setting:
        return {"network": {"profile": setting}}
    unknown = sorted(set(setting) - set(SCENARIO_KEYS))
    if unknown or not setting:
        raise SpecError([Issue(f"profiles.{name}", f"a scenario sets {' and/or '.join(SCENARIO_KEYS)}, "
                                                   f"or is a profile with a type (got {unknown or 'nothing'})")])
    training = setting.get("training", {})
    if not isinstance(training, dict) or set(training) - set(SCENARIO_TRAINING):
        raise SpecError([Issue(f"profiles.{name}.training", f"a scenario may set only {', '.join(SCENARIO_TRAINING)} "
                                                            "(anything else makes it another task: a grid of its own)")])
    return dict(setting)


def _check_readings(grid: dict, training: dict) -> None:
    """``targets`` (more targets of the grid's own metric, read off each run's accuracy or loss curve) and
    ``accuracyAfterEpochs``."""
    targets = grid.get("targets", [])
    loss = "targetLoss" in training
    if not isinstance(targets, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x
                                                and (loss or x <= 1) for x in targets):
        raise SpecError([Issue("targets", "must be a list of losses > 0 (the grid's target is targetLoss)" if loss
                               else "must be a list of accuracies in (0, 1]")])
    stop = training.get("stopAtTarget", True)  # the spec's default
    field = "targetLoss" if loss else "targetAccuracy"
    beyond = [x for x in targets if (x < training[field] if loss else x > training[field])]
    if stop and beyond:
        raise SpecError([Issue("targets", f"{'below' if loss else 'above'} base.training.{field} "
                                          f"({training[field]}), where every run stops (stopAtTarget): never "
                                          f"reached by construction ({', '.join(map(str, beyond))})")])
    epochs = grid.get("accuracyAfterEpochs")
    if epochs is not None and (not isinstance(epochs, (int, float)) or isinstance(epochs, bool) or epochs <= 0):
        raise SpecError([Issue("accuracyAfterEpochs", "must be a positive number of epochs")])


def families(grid: dict) -> dict[str, str]:
    """Each method label -> its family (``variants: {tta: [tta-plain]}``: tta-plain is tta's variant): a
    method is paired with the best method outside its own family, so that an ablation of ours is never the
    "best other" our method is measured against. A label named nowhere is its own family."""
    variants = grid.get("variants") or {}
    if not isinstance(variants, dict):
        raise SpecError([Issue("variants", "must be a mapping of method -> list of its variants' labels")])
    labels = set(grid.get("methods") or {}) | set(sensitivity_methods(grid))
    family: dict[str, str] = {}
    for head, members in variants.items():
        if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            raise SpecError([Issue(f"variants.{head}", "must be a list of method labels")])
        for label in [head, *members]:
            if label not in labels:
                raise SpecError([Issue(f"variants.{head}", f"{label!r} is not a method of this grid")])
            if family.get(label, head) != head:
                raise SpecError([Issue(f"variants.{head}", f"{label!r} is already in {family[label]}'s family")])
            family[label] = head
    return family


def variant_name(method: str, constant: str, value) -> str:
    return f"{method}-{constant}-{value:g}" if isinstance(value, (int, float)) else f"{method}-{constant}-{value}"


def sensitivity_methods(grid: dict) -> dict[str, dict]:
    """The ``sensitivity:`` section -> methods: each named method at its settings, and one variant per
    constant and value (that constant changed, everything else as the method's)::

        sensitivity:
          netsense: {method: {method: netsense, errorFeedback: false}, vary: {alpha: [0.25, 1.0], window: [5, 20]}}

    gives netsense, netsense-alpha-0.25, netsense-alpha-1, netsense-window-5, netsense-window-20.
    """
    section = grid.get("sensitivity") or {}
    if not isinstance(section, dict):
        raise SpecError([Issue("sensitivity", "a mapping of method name -> {method: {...}, vary: {constant: [values]}}")])
    out: dict[str, dict] = {}
    for name, entry in section.items():
        path = f"sensitivity.{name}"
        if not isinstance(entry, dict) or not isinstance(entry.get("method"), dict):
            raise SpecError([Issue(f"{path}.method", "required: the method's compression settings (a mapping)")])
        vary = entry.get("vary")
        if not isinstance(vary, dict) or not vary:
            raise SpecError([Issue(f"{path}.vary", "required: a mapping of constant -> list of values")])
        out[name] = dict(entry["method"])
        for constant, values in vary.items():
            if not isinstance(values, list) or not values:
                raise SpecError([Issue(f"{path}.vary.{constant}", "must be a non-empty list of values")])
            if entry["method"].get(constant) in values:
                raise SpecError([Issue(f"{path}.vary.{constant}", "lists the method's own value: that run is "
                                                                   "the method itself")])
    for method, constant, value, variant in sensitivity_groups(grid):
        out[variant] = {**section[method]["method"], constant: value}
    return out


def sensitivity_groups(grid: dict) -> list[tuple[str, str, object, str]]:
    """(method, constant, value, variant name) for each variant of a ``sensitivity:`` section (checked by
    sensitivity_methods, which load_grid calls)."""
    return [(name, constant, value, variant_name(name, constant, value))
            for name, entry in (grid.get("sensitivity") or {}).items()
            for constant, values in entry["vary"].items() for value in values]


NO_WIRE = "@nowire"  # the label suffix of a cell's contention-matched twin (``ceiling: matched``)
CEILING_STEPS = 100  # a twin's steps unless the grid says ``ceilingSteps``


FIXED_DECISIONS = ("allreduce", "topk", "powersgd")  # methods whose steps do not depend on the link they sense


def wire_twins(grid: dict, cells: list[Cell]) -> list[Cell]:
    """``ceiling: matched``: the cells with, after each, its twin: the same job with training.nullWire (the
    collectives move no bytes, netsense.compression.communicator) for ``ceilingSteps`` steps, not stopping at the
    target. Both workers then run the whole hook path, compression, error feedback, decoding and a collective
    that keeps them in step, on the same cores: the ceiling a method could reach if the wire cost nothing,
    contention included (one worker alone has no second worker's collectives on its cores).

    Only methods whose steps do not depend on the link get a twin (FIXED_DECISIONS): an adaptive method's twin
    would sense a link with no cost and choose other steps (denser, or dense), so its row is read against the
    twin of the fixed TopK density nearest its own mean density (stats.matched_ceiling). fp16 runs torch's hook:
    no twin either."""
    steps = grid.get("ceilingSteps", CEILING_STEPS)
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 10:
        raise SpecError([Issue("ceilingSteps", "must be an integer of at least 10 (the twin's steps)")])
    out = []
    for cell in cells:
        out.append(cell)
        if cell.job["spec"]["compression"].get("method", "allreduce") not in FIXED_DECISIONS:
            continue
        spec = merge(cell.job["spec"], {"training": {"nullWire": True, "stopAtTarget": False, "maxSteps": steps}})
        spec["training"].pop("minEpochs", None)
        doc = {**cell.job, "metadata": {"name": _dns(f"{cell.method}-nowire-{cell.scenario}-s{cell.seed}")},
               "spec": spec}
        parse_job(doc)
        out.append(Cell(cell.method + NO_WIRE, cell.scenario, cell.seed, doc))
    return out


def _check_one_wire_format(grid: dict, encodings: dict[str, str]) -> None:
    """Every method with a ``values`` field (topk, dc2, tta, powersgd) at one encoding, unless the grid says
    ``mixedEncodings: true``: a method's bytes, and so its time, depend on it. allreduce, fp16 and netsense have
    no such field (fixed formats, netsense its own fp16 gate): references, never a mix."""
    if len(set(encodings.values())) <= 1 or grid.get("mixedEncodings", False):
        return
    by = ", ".join(f"{m} {v}" for m, v in sorted(encodings.items(), key=lambda mv: (mv[1], mv[0])))
    raise SpecError([Issue("methods", f"mix wire formats (compression.values): {by}; set the same values on "
                                      f"each ({VALUES_DEFAULT} is the default), or say mixedEncodings: true at the grid's top "
                                      "level, with a comment saying why")])


TTA_NAMES = ("tta", "overlap", "ours")  # the method and its aliases (COMPRESSION's)


def _removed_settings(grid: dict, method: str, compression) -> tuple[dict, tuple[str, ...]]:
    """A method's compression settings less those tta has since lost (REMOVED_TTA), and the names of those it
    set to anything but their old default (at it they changed nothing). A grid
    whose methods ran with one says ``ranAt: <commit>`` (the commit its committed results were packaged at:
    testbed/results/INDEX.jsonl): its cells are read (names, settings, the committed records) but never run
    here (run_bench refuses it); any other grid naming one is refused, by name."""
    if not isinstance(compression, dict) or compression.get("method") not in TTA_NAMES:
        return compression, ()
    removed = tuple(k for k in compression if k in REMOVED_TTA and compression[k] != REMOVED_TTA[k][0])
    if removed and not grid.get("ranAt"):
        raise SpecError([Issue(f"methods.{method}.{k}", f"removed from tta (issue 62: not adopted; {REMOVED_TTA[k][1]}); "
                                                        f"commit {REMOVED_AT[:12]} is the last with it. A grid that ran "
                                                        "with it says ranAt: <the commit of its results> at its top "
                                                        "level (read, not run)") for k in removed])
    return {k: v for k, v in compression.items() if k not in REMOVED_TTA}, removed


def load_grid(path: str, only_seeds: list[int] | None = None) -> tuple[str, list[Cell], dict]:
    """The grid's cells; ``only_seeds``: just these of its seeds (a run to be completed later in the same --out).
    A grid with ``ranAt`` ran with settings since removed (_removed_settings): its cells carry them in
    ``removed``, their jobs without them."""
    grid = read_yaml(path, "grid")
    if not isinstance(grid, dict):
        raise SpecError([Issue(path, "a grid is a mapping with base, methods, profiles, seeds")])
    if not isinstance(grid.get("profiles"), dict) or not grid["profiles"]:
        raise SpecError([Issue("profiles", "required: a non-empty mapping of name -> settings")])
    methods = grid.get("methods") or {}
    if not isinstance(methods, dict) or not (methods or grid.get("sensitivity")):
        raise SpecError([Issue("methods", "required: a non-empty mapping of name -> settings "
                                          "(or a sensitivity section)")])
    varied = sensitivity_methods(grid)
    clash = sorted(set(methods) & set(varied))
    if clash:
        raise SpecError([Issue("sensitivity", f"{clash} also named under methods: name them once")])
    methods = {**methods, **varied}
    seeds = grid.get("seeds", [0])
    if not isinstance(seeds, list) or not all(isinstance(s, int) and s >= 0 for s in seeds):
        raise SpecError([Issue("seeds", "must be a list of non-negative integers")])
    if grid.get("order", "shuffled") not in ("shuffled", "grid"):
        raise SpecError([Issue("order", "must be shuffled (cells interleaved; the default) or grid")])
    if not isinstance(grid.get("orderSeed", 0), int):
        raise SpecError([Issue("orderSeed", "must be an integer (it seeds the shuffle)")])
    if only_seeds is not None:
        missing = sorted(set(only_seeds) - set(seeds))
        if missing:
            raise SpecError([Issue("--seeds", f"{missing} not among the grid's seeds {seeds}")])
        seeds = [s for s in seeds if s in only_seeds]
        grid = {**grid, "seeds": seeds}  # what the tables say was run
    base = grid.get("base") or {}
    t = base.get("training", {})
    if not ("targetAccuracy" in t or "targetLoss" in t) or not any(k in t for k in ("maxSeconds", "maxSteps", "epochs")):
        raise SpecError([Issue("base.training", "a fair benchmark needs a target (targetAccuracy or targetLoss) and a "
                                                "budget (maxSeconds, maxSteps or epochs) shared by every method")])
    _check_readings(grid, t)
    families(grid)
    epochs = grid.get("accuracyAfterEpochs")
    if epochs and t.get("stopAtTarget", True) and "minEpochs" not in t:
        # Every run trains that long before it stops at the target, so the accuracy after equal epochs is
        # read off every seed of every method, not only those slower than the epochs (time to accuracy is
        # the first crossing either way).
        base = merge(base, {"training": {"minEpochs": epochs}})
    ran_at = grid.get("ranAt")
    if ran_at is not None and not (isinstance(ran_at, str) and len(ran_at) == 40
                                   and all(ch in "0123456789abcdef" for ch in ran_at)):
        raise SpecError([Issue("ranAt", "the full commit (40 hex digits) its committed results were packaged at")])
    if not isinstance(grid.get("mixedEncodings", False), bool):
        raise SpecError([Issue("mixedEncodings", "must be true or false (true: this grid compares methods at "
                                                 "different values encodings on purpose)")])
    cells = []
    encodings: dict[str, str] = {}  # method -> its compression.values, for the methods that have the field
    for method, compression in methods.items():
        compression, removed = _removed_settings(grid, method, compression)
        for scenario, setting in grid["profiles"].items():
            over = _scenario(scenario, setting)
            for seed in seeds:
                spec = merge(merge(base, over), {"training": {"seed": seed}})
                spec["compression"] = copy.deepcopy(compression)  # a method's settings are its own: never merged
                doc = {"apiVersion": API_VERSION, "kind": KIND,
                       "metadata": {"name": _dns(f"{method}-{scenario}-s{seed}")}, "spec": spec}
                try:
                    job = parse_job(doc)
                except SpecError as e:
                    raise SpecError([Issue(f"{method} x {scenario}: {i.path}", i.message) for i in e.issues]) from None
                if "values" in job.spec["compression"]:
                    encodings[method] = job.spec["compression"]["values"]
                cells.append(Cell(method, scenario, seed, doc, removed))
    if ran_at and not any(c.removed for c in cells):
        raise SpecError([Issue("ranAt", "only for a grid whose methods ran with settings since removed (none here): "
                                        "leave it out, and the grid runs")])
    _check_one_wire_format(grid, encodings)
    if grid.get("ceiling", False) not in (False, True, "matched"):
        raise SpecError([Issue("ceiling", "true (one worker alone, before and after the cells) or matched (each "
                                          "cell's twin without the wire, interleaved among the cells)")])
    if grid.get("ceiling") == "matched":
        cells = wire_twins(grid, cells)
    elif "ceilingSteps" in grid:
        raise SpecError([Issue("ceilingSteps", "only with ceiling: matched (the twins' steps)")])
    return grid.get("name", os.path.splitext(os.path.basename(path))[0]), cells, grid
