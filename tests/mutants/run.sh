#!/usr/bin/env bash
# Each mutant (tests/mutants/*.patch) breaks one behaviour on purpose; the test named on its first line
# ("test: <pytest args>") must then fail. Run before a release, not in CI (the API-server ones need envtest):
#   bash tests/mutants/run.sh            # every mutant
#   bash tests/mutants/run.sh leader-*   # those whose name matches
# It applies each patch to this working tree (which must be clean), runs the test, and reverts the patch, also
# on Ctrl-C. A mutant whose test passes is a test that cannot catch its regression: the script exits 1.
set -uo pipefail
cd "$(dirname "$0")/../.."
if ! git diff --quiet || ! git diff --cached --quiet; then
  echo "mutants: the working tree has changes; commit or stash them first" >&2
  exit 2
fi
pattern=${1:-*}
applied=""
revert() { [[ -n $applied ]] && git apply -R "$applied" && applied=""; }
trap 'revert; exit 130' INT TERM
survived=()
for patch in tests/mutants/$pattern.patch; do
  name=$(basename "$patch" .patch)
  read -r -a args <<<"$(head -1 "$patch" | sed 's/^test: //')"
  git apply "$patch" || { echo "mutants: $name no longer applies" >&2; survived+=("$name (stale)"); continue; }
  applied=$patch
  if KUBEBUILDER_ASSETS=${KUBEBUILDER_ASSETS:-$(bash testbed/envtest/build.sh)} \
      .venv/bin/pytest -q -x -p no:cacheprovider "${args[@]}" >/tmp/mutant-"$name".log 2>&1; then
    echo "SURVIVED $name: ${args[*]} passed (log: /tmp/mutant-$name.log)"
    survived+=("$name")
  else
    echo "killed   $name"
  fi
  revert
done
trap - INT TERM
if ((${#survived[@]})); then
  echo "mutants: ${#survived[@]} survived: ${survived[*]}" >&2
  exit 1
fi
echo "mutants: every one killed"
