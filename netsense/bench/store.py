"""The committed results store (testbed/results): one record a line, compressed where large, and an index.

A results file is JSON Lines, its first line a header::

    {"netsense_results": 1, "layout": "rows", "nested": "per_seed", "rows": 26, "records": 260}
    {"scenario": "cnn1024-fluctuating-40-800", "method": "topk-0.005", ..., "per_seed": 10, ..., "code_commit": ...}
    {"seed": 70, "steps_to_target": 90, "accuracy_curve": [...], ...}
    ... (the row's 10 seeds, then the next row)

``rows``: a bench table (table.json: a list of rows, each with its seeds' records in ``per_seed``). Each row is one
line with ``per_seed`` replaced by how many seed records follow it, one a line, in their order; the row's other
keys keep their order, so what loads is what was saved, key order included. ``object``: a JSON object whose one
list of records (``nested``) is written a record a line; the header's ``object`` holds the object's other fields
with that list replaced by its length. ``json``: anything else, whole on the line after the header. A file whose
first line is no such header is plain JSON Lines: it loads as the list of its lines.

A file of more than ``GZIP_ABOVE`` bytes is gzip-compressed (``.jsonl.gz``; mtime 0 and no name in the gzip
header, so the same data gives the same bytes and an unchanged table is no change to git), a smaller one stays
``.jsonl`` (readable and diffable as it is; ``git diff`` reads a ``.jsonl.gz`` through gzip with the textconv
in .gitattributes). Floats are written as Python's repr, which reads back to the same float.

Old names keep working: ``load("testbed/results/fair4.json")`` reads ``fair4.jsonl.gz`` (``resolve``: the path
as given, else the same stem as .jsonl.gz, .jsonl, .json), so a script or a link that names a table by its old
``<grid>.json`` still finds it, and a bench run's own table.json (runs/, not committed) loads the same way.

``INDEX.jsonl`` in the results folder names every file there, one a line: for a results file, its layout, rows
and records, the grid file it ran (testbed/grids/<name>.yaml, where there is one), the commits its rows name
(``commit``: the checkout; ``code_commit``: the last change to the package; ``grid_commit``), whether the package
had uncommitted changes, and the package's name and version at ``code_commit`` (from git; "unknown" where the
commit is not in this history or the records name none); for a table or plot, the results file of the same name
it was drawn from, if any. ``index()`` computes it from the files; ``python -m netsense.bench.store index`` writes
it, and ``land`` saves a bench run's table under testbed/results and writes the index::

    python -m netsense.bench.store land runs/final/eval4/table.json testbed/results/eval4
    python -m netsense.bench.store index [testbed/results]
    python -m netsense.bench.store cat testbed/results/eval4.json      # the data as indented JSON
    python -m netsense.bench.store landed testbed/results/eval4 CODE_COMMIT GRID_COMMIT   # exit 0: it is
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import subprocess
import sys
from typing import Any

FORMAT = 1
GZIP_ABOVE = 64 * 1024
SUFFIXES = (".jsonl.gz", ".jsonl", ".json")  # the order resolve() tries them in
INDEX = "INDEX.jsonl"
UNKNOWN = "unknown"
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def stem(path: str) -> str:
    """The path without a results suffix (.jsonl.gz, .jsonl, .json)."""
    for suffix in SUFFIXES:
        if path.endswith(suffix):
            return path[: -len(suffix)]
    return path


def resolve(path: str) -> str | None:
    """The file ``path`` names: itself if it exists, else its stem as .jsonl.gz, .jsonl or .json; None if none."""
    if os.path.isfile(path):
        return path
    return next((p for p in (stem(path) + s for s in SUFFIXES) if os.path.isfile(p)), None)


def exists(path: str) -> bool:
    return resolve(path) is not None


def load(path: str) -> Any:
    """The data a results file holds, as the JSON it was saved from (.json, .jsonl or .jsonl.gz alike)."""
    found = resolve(path)
    if found is None:
        raise FileNotFoundError(f"{path}: no such results file (nor {', '.join(stem(path) + s for s in SUFFIXES)})")
    if found.endswith(".gz"):
        with gzip.open(found, "rt", encoding="utf-8") as fh:
            return decode(fh.read(), found)
    with open(found, encoding="utf-8") as fh:
        text = fh.read()
    if found.endswith(".jsonl"):
        return decode(text, found)
    return json.loads(text)


def _header(data: Any) -> tuple[dict, list[str]]:
    """The header and the lines after it."""
    line = json.dumps
    if isinstance(data, list) and all(isinstance(r, dict) for r in data):
        lines, records = [], 0
        for r in data:
            seeds = r.get("per_seed")
            if isinstance(seeds, int) and not isinstance(seeds, bool):
                raise ValueError("a row's per_seed is a number: it would read back as a count of records")
            if isinstance(seeds, list):
                lines.append(line({**r, "per_seed": len(seeds)}))
                lines += [line(s) for s in seeds]
                records += len(seeds)
            else:
                lines.append(line(r))
        return {"netsense_results": FORMAT, "layout": "rows", "nested": "per_seed", "rows": len(data),
                "records": records}, lines
    lists = [k for k, v in data.items() if isinstance(v, list)] if isinstance(data, dict) else []
    if len(lists) == 1:
        key = lists[0]
        return ({"netsense_results": FORMAT, "layout": "object", "nested": key, "records": len(data[key]),
                 "object": {**data, key: len(data[key])}}, [line(r) for r in data[key]])
    return {"netsense_results": FORMAT, "layout": "json"}, [line(data)]


def encode(data: Any) -> str:
    """The JSON Lines text of ``data`` (the header, then a record a line)."""
    header, lines = _header(data)
    return "\n".join([json.dumps(header), *lines]) + "\n"


def decode(text: str, name: str = "results") -> Any:
    """encode's inverse; a file without the header is plain JSON Lines (the list of its lines)."""
    lines = [json.loads(x) for x in text.splitlines() if x.strip()]
    if not lines or not isinstance(lines[0], dict) or "netsense_results" not in lines[0]:
        return lines
    header, body = lines[0], iter(lines[1:])
    if header["netsense_results"] != FORMAT:
        raise ValueError(f"{name}: results format {header['netsense_results']}, this code reads {FORMAT}")
    try:
        if header["layout"] == "rows":
            key, rows = header["nested"], []
            for _ in range(header["rows"]):
                row = next(body)
                if isinstance(row.get(key), int) and not isinstance(row[key], bool):
                    row[key] = [next(body) for _ in range(row[key])]
                rows.append(row)
            data = rows
        elif header["layout"] == "object":
            key = header["nested"]
            data = {**header["object"], key: [next(body) for _ in range(header["object"][key])]}
        elif header["layout"] == "json":
            data = next(body)
        else:
            raise ValueError(f"{name}: unknown layout {header['layout']!r}")
    except StopIteration:
        raise ValueError(f"{name}: fewer lines than its header says (truncated?)") from None
    if next(body, None) is not None:
        raise ValueError(f"{name}: more lines than its header says")
    return data


def save(path: str, data: Any) -> str:
    """Write ``data`` as ``path``'s stem + .jsonl, or + .jsonl.gz above GZIP_ABOVE bytes; the stem's other
    files (an old .json, the other suffix) are removed, so one file holds it. Returns the path written."""
    text = encode(data).encode("utf-8")
    base = stem(path)
    target = base + (".jsonl.gz" if len(text) > GZIP_ABOVE else ".jsonl")
    if target.endswith(".gz"):
        buf = io.BytesIO()
        with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
            gz.write(text)
        text = buf.getvalue()
    tmp = target + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(text)
    os.replace(tmp, target)
    for other in (base + s for s in SUFFIXES):
        if other != target and os.path.isfile(other):
            os.remove(other)
    return target


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", _REPO, *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def package_at(commit: str | None) -> str:
    """"name version" of the package as pyproject.toml had it at ``commit`` (UNKNOWN where git cannot say)."""
    text = _git("show", f"{commit}:pyproject.toml") if commit and commit != UNKNOWN else None
    if not text:
        return UNKNOWN
    import tomllib

    project = tomllib.loads(text).get("project", {})
    return f"{project['name']} {project['version']}" if project.get("name") and project.get("version") else UNKNOWN


def _distinct(values: list) -> list | str:
    seen = list(dict.fromkeys(v for v in values if v is not None))
    return seen or UNKNOWN


def describe(data: Any) -> dict:
    """What a results file holds: its layout, rows, records and the provenance its rows name."""
    header, _ = _header(data)
    out = {"layout": header["layout"]}
    if header["layout"] == "rows":
        rows = data
        out.update(rows=header["rows"], records=header["records"])
    else:
        rows = []
        out.update(records=header.get("records", 1))
    out.update(commit=_distinct([r.get("commit") for r in rows]),
               code_commit=_distinct([r.get("code_commit") for r in rows]),
               grid_commit=_distinct([r.get("grid_commit") for r in rows]))
    dirty = {r.get("dirty") for r in rows} - {None}
    out["dirty"] = (True in dirty) if dirty else UNKNOWN
    return out


def _is_data(name: str) -> bool:
    return name != INDEX and name.endswith(SUFFIXES) and not name.endswith(".tmp")


def index(folder: str, packages: bool = True) -> list[dict]:
    """One entry a file of ``folder`` (INDEX.jsonl itself aside), sorted by name. ``packages``: read the package's
    version at each code_commit from git (False: "package" left out, for a check that must not need git)."""
    names = sorted(n for n in os.listdir(folder) if os.path.isfile(os.path.join(folder, n)) and n != INDEX)
    data_of = {stem(n): n for n in names if _is_data(n)}
    from netsense.bench.grid import grid_path  # the spec's modules: only where an index is written
    cache: dict[str, str] = {}
    entries = []
    for name in names:
        if _is_data(name):
            base = stem(name)
            grid = grid_path(base) or UNKNOWN
            entry = {"file": name, "kind": "results", "grid": grid, **describe(load(os.path.join(folder, name)))}
            if packages:
                code = entry["code_commit"]
                commits = code if isinstance(code, list) else [UNKNOWN]
                for c in commits:
                    cache.setdefault(c, package_at(c))
                entry["package"] = _distinct([cache[c] for c in commits if cache[c] != UNKNOWN])
        else:
            kind = {".md": "table", ".png": "plot"}.get(os.path.splitext(name)[1], "other")
            drawn = next((data_of[s] for s in (name.rsplit(".", 1)[0], name.rsplit("-", 1)[0]) if s in data_of), None)
            entry = {"file": name, "kind": kind, "from": drawn or UNKNOWN}
        entries.append(entry)
    return entries


def write_index(folder: str) -> str:
    path = os.path.join(folder, INDEX)
    with open(path, "w") as fh:
        fh.writelines(json.dumps(e) + "\n" for e in index(folder))
    return path


def read_index(folder: str) -> list[dict]:
    with open(os.path.join(folder, INDEX)) as fh:
        return [json.loads(x) for x in fh if x.strip()]


def landed(path: str, code_commit: str, grid_commit: str) -> bool:
    """Whether the results file holds a table that this package commit and grid commit produced (every row)."""
    if not exists(path):
        return False
    rows = load(path)
    return (isinstance(rows, list) and bool(rows)
            and all(r.get("code_commit") == code_commit and r.get("grid_commit") == grid_commit for r in rows))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m netsense.bench.store", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("land", help="save a table (any results file) under a results name, and write the index")
    p.add_argument("source")
    p.add_argument("dest", help="the results name: testbed/results/GRID (a suffix is ignored)")
    p = sub.add_parser("index", help="write the folder's INDEX.jsonl")
    p.add_argument("folder", nargs="?", default=os.path.join(_REPO, "testbed", "results"))
    p = sub.add_parser("cat", help="print a results file's data as indented JSON")
    p.add_argument("path")
    p = sub.add_parser("landed", help="exit 0 if every row of the table ran this package and grid commit")
    p.add_argument("path")
    p.add_argument("code_commit")
    p.add_argument("grid_commit")
    a = ap.parse_args(argv)
    if a.command == "land":
        written = save(a.dest, load(a.source))
        write_index(os.path.dirname(os.path.abspath(written)))
        print(written)
    elif a.command == "index":
        print(write_index(a.folder))
    elif a.command == "cat":
        json.dump(load(a.path), sys.stdout, indent=1)
        print()
    else:
        return 0 if landed(a.path, a.code_commit, a.grid_commit) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
