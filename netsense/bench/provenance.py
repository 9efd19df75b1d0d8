"""Which code and which grid produced a table: the commit (and whether the tree differed from it), and the
commit that last changed the grid file, so a reader can check the grid was committed before it was run."""

from __future__ import annotations

import os
import subprocess

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNKNOWN = {"commit": None, "dirty": None, "code_commit": None, "grid_commit": None, "grid_dirty": None}


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", _PACKAGE, *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def provenance(grid_path: str) -> dict:
    """{commit, dirty, code_commit, grid_commit, grid_dirty}: None where this is not a git checkout (an
    installed package). code_commit: the commit that last changed the package, so cells run at different
    commits (a README edit between two grids) can be shown to have run the same code."""
    commit, top = _git("rev-parse", "HEAD"), _git("rev-parse", "--show-toplevel")
    if commit is None or top is None or not os.path.isfile(os.path.join(top, "pyproject.toml")):
        # Not a checkout of this project (an installed package, perhaps inside some other repository).
        return dict(UNKNOWN)
    grid = os.path.abspath(grid_path)
    # Only the package's own files count as "dirty": results and scratch files in the checkout do not
    # change what ran. Pathspecs from the top: git -C runs in the package folder.
    changed = _git("status", "--porcelain", "--untracked-files=no", "--", ":/netsense", ":/pyproject.toml")
    return {"commit": commit, "dirty": bool(changed),
            "code_commit": _git("log", "-1", "--format=%H", "--", ":/netsense", ":/pyproject.toml") or None,
            "grid_commit": _git("log", "-1", "--format=%H", "--", grid) or None,
            "grid_dirty": bool(_git("status", "--porcelain", "--", grid))}


def describe(p: dict, results: list[dict] | None = None) -> str:
    """One line for summary.md; ``results``: the cells', some perhaps reused from an earlier run into the
    same --out (each keeps the commit that ran it), so a table from several commits says so."""
    def code(x: dict) -> str:
        return x.get("code_commit") or x.get("commit") or "unknown"

    runs = results or []
    others = sorted({code(r) for r in runs} - {code(p)})
    mixed = (f" Some cells were reused from earlier runs of other commits ({', '.join(c[:12] for c in others)})."
             if others else "")
    siblings = sorted({r.get("commit") or "unknown" for r in runs if code(r) == code(p)} - {p.get("commit")})
    if siblings:
        mixed += (f" Some cells ran at other commits of the same package code ({', '.join(c[:12] for c in siblings)}"
                  f"; the package last changed in {code(p)[:12]}).")
    if any(r.get("dirty") for r in runs) and not p.get("dirty"):
        mixed += " Some cells were reused from runs with uncommitted changes to the package."
    if not p.get("commit"):
        return "Code: not a git checkout (commit unknown)." + mixed
    code_line = f"Code: commit {p['commit'][:12]}"
    if p.get("code_commit") and p["code_commit"] != p["commit"]:
        code_line += f" (the package as last changed in {p['code_commit'][:12]})"
    if p["dirty"]:
        code_line += " with uncommitted changes to the package"
    if p.get("grid_dirty"):
        grid = "the grid file has uncommitted changes"
    elif p.get("grid_commit"):
        grid = f"the grid file as committed in {p['grid_commit'][:12]}"
    else:
        grid = "the grid file is not in the repository"
    return f"{code_line}; {grid}.{mixed}"
