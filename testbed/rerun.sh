#!/usr/bin/env bash
# The final run: every evaluation grid, on one version of the code, each in one invocation.
#
#   bash testbed/rerun.sh                 # every grid below, in this order (about 7 hours on 2 cores);
#                                         # one whose table this code and grid produced already is skipped
#   bash testbed/rerun.sh eval2 headline  # just these
#
#   RERUN_COMMIT=1 bash testbed/rerun.sh  # also commit each grid's results the moment they land
#
# Each grid runs into runs/final/<grid>/ with `netsense bench` (cells shuffled and interleaved; a
# finished cell is kept, so an interrupted grid resumes where it stopped while runs/ is there: it is
# not in the repository), then its table lands in testbed/results/<grid>.md, and the bench's
# table.json as testbed/results/<grid>.jsonl.gz (or .jsonl under 64 kB: the results store,
# netsense.bench.store, which also rewrites testbed/results/INDEX.jsonl; what testbed/overview.py reads,
# and what says a grid is done). The plots stay in runs/final/<grid>/ (the store keeps only the plots a
# document shows: add one by hand where the README needs it). The tables name the commit that ran them
# and the commit that last changed the package: a commit that only touches the README or the tests
# between two grids leaves the code the same, and the tables say so. The script refuses to start on a package or grid with uncommitted
# changes (a grid is registered by committing it before it runs).
#
# Not here: ci.yaml (the tuning set: nothing there is a claim), paper.yaml (ResNet18 on CIFAR-100 for
# GPUs), and the before/after grids (eval2-after, eval2-probing, eval4-probing), which compare a change
# with the code before it and ran on their own commits.
set -euo pipefail
cd "$(dirname "$0")/.."

GRIDS=(eval eval2 eval3 sensitivity headline throughput epochs congestion eval4 eval5)
[ $# -gt 0 ] && GRIDS=("$@")

NETSENSE=${NETSENSE:-.venv/bin/netsense}
PY=${PY:-$(dirname "$NETSENSE")/python}
[ "$(id -u)" = 0 ] || { echo "rerun.sh: needs root (network namespaces and tc)" >&2; exit 2; }
[ -x "$NETSENSE" ] || { echo "rerun.sh: $NETSENSE not found: run 'make venv' first" >&2; exit 2; }
for g in "${GRIDS[@]}"; do
    [ -f "testbed/grids/$g.yaml" ] || { echo "rerun.sh: no grid testbed/grids/$g.yaml" >&2; exit 2; }
done
if [ -n "$(git status --porcelain --untracked-files=no -- netsense pyproject.toml testbed/grids)" ]; then
    echo "rerun.sh: the package or a grid has uncommitted changes: commit them first (a table must name" >&2
    echo "          the code that produced it, and a grid is registered before it runs)" >&2
    exit 2
fi

mkdir -p runs/final
code=$(git log -1 --format=%H -- netsense pyproject.toml)
for g in "${GRIDS[@]}"; do
    out="runs/final/$g"
    grid=$(git log -1 --format=%H -- "testbed/grids/$g.yaml")
    landed="testbed/results/$g"
    # Done already: a landed table of this package and this grid.
    if "$PY" -m netsense.bench.store landed "$landed" "$code" "$grid"; then
        echo "rerun.sh: $g done on this code and grid already ($landed): skipped" >&2
        continue
    fi
    start=$(date -u '+%Y-%m-%d %H:%M')
    echo "rerun.sh: $g -> $out (log $out.log), started $start UTC" >&2
    rc=0
    rm -f "$out/summary.md"  # written again only once every cell has run
    "$NETSENSE" bench "testbed/grids/$g.yaml" --out "$out" > "$out.log" 2>&1 || rc=$?
    if [ ! -f "$out/summary.md" ]; then
        echo "rerun.sh: $g failed (rc $rc) before its table: see $out.log" >&2
        exit 1
    fi
    {
        echo "<!-- \`bash testbed/rerun.sh $g\` = \`netsense bench testbed/grids/$g.yaml --out $out\`,"
        echo "     started $start UTC (this invocation), finished $(date -u '+%Y-%m-%d %H:%M') UTC; rc $rc"
        echo "     (1: some cell failed: its row says so). Written by the script: notes go in the README. -->"
        echo
        cat "$out/summary.md"
    } > "testbed/results/$g.md"
    "$PY" -m netsense.bench.store land "$out/table.json" "$landed" >/dev/null
    # What this grid wrote (git pathspecs: the table under whichever suffix, an old one's removal too).
    files=("testbed/results/$g.md" "testbed/results/$g.json*" testbed/results/INDEX.jsonl)
    echo "rerun.sh: $g done (rc $rc): testbed/results/$g.md" >&2
    if [ "${RERUN_COMMIT:-0}" = 1 ]; then
        git add -A -- "${files[@]}"
        git commit -q -m "Results: $g from the final run (written by testbed/rerun.sh, rc $rc)" -- "${files[@]}"
    fi
done
