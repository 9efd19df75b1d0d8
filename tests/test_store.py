"""The results store (netsense.bench.store): what is saved loads back as it was, key order included, from
.jsonl and .jsonl.gz alike and under the old .json name; and testbed/results's INDEX.jsonl names every file."""

from __future__ import annotations

import gzip
import json
import os

import pytest
from support import REPO

from netsense.bench import store

RESULTS = os.path.join(REPO, "testbed", "results")


def _table(rows: int, seeds: int, curve: int) -> list[dict]:
    """A bench table's shape: rows with summary columns around each seed's records (per_seed in the middle)."""
    return [{"scenario": f"s{r % 2}", "method": f"topk-0.0{r}", "seeds": seeds, "tta_mean_s": 3.4734000000000003 + r,
             "cross_mbit": None, "failures": [], "per_seed": [
                 {"seed": s, "steps_to_target": None if s == 1 else 90 + s, "status": "Succeeded",
                  "accuracy_curve": [[i, i / 7, 1 / 3 + i] for i in range(curve)], "link": {"min": 40.0, "max": 1e-9}}
                 for s in range(seeds)],
             "regret": 1.0, "targets": {"0.85": {"reached": "2/2"}}, "after_epochs": None, "dirty": False,
             "commit": "c" * 40, "code_commit": "d" * 40, "grid_commit": None} for r in range(rows)]


@pytest.mark.parametrize("curve, suffix", [(2, ".jsonl"), (400, ".jsonl.gz")])
def test_a_table_round_trips_through_save_and_load_small_plain_and_large_compressed(tmp_path, curve, suffix):
    data = _table(3, 4, curve)
    (tmp_path / "g.json").write_text(json.dumps(data, indent=1))
    written = store.save(str(tmp_path / "g.json"), data)
    assert written == str(tmp_path / f"g{suffix}")
    assert sorted(os.listdir(tmp_path)) == [f"g{suffix}"]  # the old .json went: one file holds it
    for name in ("g.json", "g", f"g{suffix}"):  # the old name, the stem and the file itself
        back = store.load(str(tmp_path / name))
        assert back == data and json.dumps(back) == json.dumps(data)  # key order too
    raw = (gzip.decompress if suffix.endswith(".gz") else bytes)((tmp_path / f"g{suffix}").read_bytes())
    lines = raw.decode().splitlines()
    assert json.loads(lines[0]) == {"netsense_results": 1, "layout": "rows", "nested": "per_seed", "rows": 3,
                                    "records": 12}
    assert len(lines) == 1 + 3 + 12 and json.loads(lines[1])["per_seed"] == 4  # a record a line
    assert list(json.loads(lines[1])) == list(data[0])
    # The same data gives the same bytes (no time or name in the gzip header): an unchanged table is no diff.
    before = (tmp_path / f"g{suffix}").read_bytes()
    store.save(str(tmp_path / "g"), store.load(str(tmp_path / "g")))
    assert (tmp_path / f"g{suffix}").read_bytes() == before


def test_an_object_with_one_list_of_records_and_anything_else_round_trip(tmp_path):
    obj = {"before": "0249b69", "records": [{"task": "t", "before": {"tta_s": 7.073}}, {"task": "u"}], "after": "x"}
    assert store.load(store.save(str(tmp_path / "first-step.json"), obj)) == obj
    header = json.loads((tmp_path / "first-step.jsonl").read_text().splitlines()[0])
    assert header["layout"] == "object" and header["object"] == {"before": "0249b69", "records": 2, "after": "x"}
    for other in ({"a": [1], "b": [2]}, [1, 2.5, None], "text", [], {}):
        assert store.load(store.save(str(tmp_path / "x"), other)) == other
    (tmp_path / "plain.jsonl").write_text('{"a": 1}\n{"a": 2}\n')  # plain JSON Lines: the list of its lines
    assert store.load(str(tmp_path / "plain.jsonl")) == [{"a": 1}, {"a": 2}]


def test_the_loader_refuses_what_it_cannot_read_whole(tmp_path):
    with pytest.raises(FileNotFoundError, match="nor .*missing.jsonl.gz"):
        store.load(str(tmp_path / "missing.json"))
    text = store.encode(_table(2, 3, 1)).splitlines()
    (tmp_path / "cut.jsonl").write_text("\n".join(text[:-1]) + "\n")
    with pytest.raises(ValueError, match="fewer lines"):
        store.load(str(tmp_path / "cut.jsonl"))
    with pytest.raises(ValueError, match="per_seed is a number"):
        store.encode([{"per_seed": 3}])


def test_the_index_names_every_file_of_the_results_and_what_each_holds():
    """INDEX.jsonl: one entry a file (itself aside), and each results file's entry says what the file holds now
    (a table landed without writing the index fails here). The package versions come from git: not compared."""
    index = store.read_index(RESULTS)
    files = sorted(n for n in os.listdir(RESULTS) if n != store.INDEX)
    assert [e["file"] for e in index] == files
    now = store.index(RESULTS, packages=False)
    assert [{k: v for k, v in e.items() if k != "package"} for e in index] == now
    data = [e for e in index if e["kind"] == "results"]
    assert data and all(e["package"] for e in data)
    assert not [n for n in files if n.endswith(".json")], "a results file not in the store's format"
