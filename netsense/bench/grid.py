"""The grid file -> cells: one NetSenseJob per method x scenario x seed (the format: netsense.bench)."""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass

from netsense.spec import API_VERSION, KIND, SpecError, parse_job
from netsense.spec.job import read_yaml
from netsense.spec.schema import Issue


@dataclass(frozen=True)
class Cell:
    method: str
    scenario: str
    seed: int
    job: dict  # a full NetSenseJob document

    @property
    def name(self) -> str:
        return f"{self.method}--{self.scenario}--s{self.seed}"


def merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def _dns(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")[:50]


SCENARIO_KEYS = ("network", "workers")


def _scenario(name: str, setting) -> dict:
    """A profile (a mapping with a type), or a scenario: a whole spec.network and/or another worker count."""
    if not isinstance(setting, dict) or "type" in setting:
        return {"network": {"profile": setting}}
    unknown = sorted(set(setting) - set(SCENARIO_KEYS))
    if unknown or not setting:
        raise SpecError([Issue(f"profiles.{name}", f"a scenario sets {' and/or '.join(SCENARIO_KEYS)}, "
                                                   f"or is a profile with a type (got {unknown or 'nothing'})")])
    return dict(setting)


def _check_readings(grid: dict, training: dict) -> None:
    """``targets`` (more targets, read off each run's accuracy curve) and ``accuracyAfterEpochs``."""
    targets = grid.get("targets", [])
    if not isinstance(targets, list) or not all(isinstance(x, (int, float)) and 0 < x <= 1 for x in targets):
        raise SpecError([Issue("targets", "must be a list of accuracies in (0, 1]")])
    stop = training.get("stopAtTarget", True)  # the spec's default
    if stop and any(x > training["targetAccuracy"] for x in targets):
        raise SpecError([Issue("targets", f"above base.training.targetAccuracy ({training['targetAccuracy']}), "
                                          "where every run stops (stopAtTarget): never reached by construction")])
    epochs = grid.get("accuracyAfterEpochs")
    if epochs is not None and (not isinstance(epochs, (int, float)) or isinstance(epochs, bool) or epochs <= 0):
        raise SpecError([Issue("accuracyAfterEpochs", "must be a positive number of epochs")])


def load_grid(path: str, only_seeds: list[int] | None = None) -> tuple[str, list[Cell], dict]:
    """The grid's cells; ``only_seeds``: just these of its seeds (a run to be completed later in the same --out)."""
    grid = read_yaml(path, "grid")
    if not isinstance(grid, dict):
        raise SpecError([Issue(path, "a grid is a mapping with base, methods, profiles, seeds")])
    for key in ("methods", "profiles"):
        if not isinstance(grid.get(key), dict) or not grid[key]:
            raise SpecError([Issue(key, "required: a non-empty mapping of name -> settings")])
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
    if "targetAccuracy" not in t or not any(k in t for k in ("maxSeconds", "maxSteps", "epochs")):
        raise SpecError([Issue("base.training", "a fair benchmark needs targetAccuracy and a budget "
                                                "(maxSeconds, maxSteps or epochs) shared by every method")])
    _check_readings(grid, t)
    cells = []
    for method, compression in grid["methods"].items():
        for scenario, setting in grid["profiles"].items():
            over = _scenario(scenario, setting)
            for seed in seeds:
                spec = merge(base, {**over, "training": {"seed": seed}})
                spec["compression"] = copy.deepcopy(compression)  # a method's settings are its own: never merged
                doc = {"apiVersion": API_VERSION, "kind": KIND,
                       "metadata": {"name": _dns(f"{method}-{scenario}-s{seed}")}, "spec": spec}
                try:
                    parse_job(doc)
                except SpecError as e:
                    raise SpecError([Issue(f"{method} x {scenario}: {i.path}", i.message) for i in e.issues]) from None
                cells.append(Cell(method, scenario, seed, doc))
    return grid.get("name", os.path.splitext(os.path.basename(path))[0]), cells, grid
