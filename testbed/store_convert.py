"""One-off (issue 68): testbed/results from pretty-printed JSON to the store (netsense.bench.store).

    python testbed/store_convert.py [--dry]

Each results file <name>.json is saved as <name>.jsonl or <name>.jsonl.gz (store.save) and read back: the data
must equal what json.load gave, key order included (compared as their JSON text), or nothing is removed. Then
every plot (.png) that no tracked Markdown file names is deleted, and INDEX.jsonl is written. Prints what it did.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess

from netsense.bench import store

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "testbed", "results")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry", action="store_true", help="say what would change, change nothing")
    a = ap.parse_args()
    for name in sorted(n for n in os.listdir(RESULTS) if n.endswith(".json")):
        path = os.path.join(RESULTS, name)
        with open(path) as fh:
            data = json.load(fh)
        if a.dry:
            print(f"would convert {name} ({os.path.getsize(path)} bytes)")
            continue
        written = store.save(path, data)
        back = store.load(written)
        if json.dumps(back) != json.dumps(data):
            with open(path, "w") as fh:  # save removed it: put it back as it was read
                json.dump(data, fh, indent=1)
            raise SystemExit(f"{name}: {os.path.basename(written)} does not read back the same: {name} kept")
        print(f"{name} -> {os.path.basename(written)} ({os.path.getsize(written)} bytes)")
    tracked = subprocess.run(["git", "-C", REPO, "ls-files", "*.md"], capture_output=True, text=True,
                             check=True).stdout.split()
    text = "".join(open(os.path.join(REPO, p)).read() for p in tracked if os.path.isfile(os.path.join(REPO, p)))
    for name in sorted(n for n in os.listdir(RESULTS) if n.endswith(".png")):
        if name in text:
            print(f"kept {name} (a Markdown file names it)")
        elif a.dry:
            print(f"would delete {name}")
        else:
            os.remove(os.path.join(RESULTS, name))
            print(f"deleted {name}")
    if not a.dry:
        print(f"wrote {os.path.relpath(store.write_index(RESULTS), REPO)}")


if __name__ == "__main__":
    main()
