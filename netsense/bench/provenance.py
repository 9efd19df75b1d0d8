"""Which code and which grid produced a table: the commit (and whether the tree differed from it), and the
commit that last changed the grid file, so a reader can check the grid was committed before it was run."""

from __future__ import annotations

import os
import subprocess

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", _PACKAGE, *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def provenance(grid_path: str) -> dict:
    """{commit, dirty, grid_commit, grid_dirty}: None where this is not a git checkout (an installed package)."""
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None, "grid_commit": None, "grid_dirty": None}
    grid = os.path.abspath(grid_path)
    # Only the package's own files count as "dirty": results and scratch files in the checkout do not
    # change what ran.
    changed = _git("status", "--porcelain", "--untracked-files=no", "--", "netsense", "pyproject.toml")
    return {"commit": commit, "dirty": bool(changed),
            "grid_commit": _git("log", "-1", "--format=%H", "--", grid) or None,
            "grid_dirty": bool(_git("status", "--porcelain", "--", grid))}


def describe(p: dict) -> str:
    """One line for summary.md."""
    if not p.get("commit"):
        return "Code: not a git checkout (commit unknown)."
    code = f"Code: commit {p['commit'][:12]}" + (" with uncommitted changes to the package" if p["dirty"] else "")
    if p.get("grid_dirty"):
        grid = "the grid file has uncommitted changes"
    elif p.get("grid_commit"):
        grid = f"the grid file as committed in {p['grid_commit'][:12]}"
    else:
        grid = "the grid file is not in the repository"
    return f"{code}; {grid}."
