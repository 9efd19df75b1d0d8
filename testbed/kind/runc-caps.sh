#!/usr/bin/env bash
# The OCI runtime testbed/kind/dockerd.sh gives its dockerd: runc, after dropping from a container's
# capability sets those this machine's own bounding set lacks. Docker 20.10 gives a --privileged
# container (every kind node is one) every capability the kernel knows; where the host itself runs
# without some (this VM has no CAP_SYS_RESOURCE), runc then fails with
# "unable to apply caps: operation not permitted". Nothing else in the spec is changed.
set -euo pipefail
bundle= process=
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case ${args[i]} in
    create | run) cmd=${args[i]} ;;
    --bundle | -b) bundle=${args[i + 1]:-} ;;
    --bundle=*) bundle=${args[i]#--bundle=} ;;
    exec) cmd=exec ;;
    --process | -p) process=${args[i + 1]:-} ;;
    --process=*) process=${args[i]#--process=} ;;
  esac
done
# keep <json file> <jq path of the capabilities object>: drop the capabilities the host lacks
keep() {
  local file=$1 path=$2 bnd names keep tmp
  bnd=$((16#$(awk '/^CapBnd/ {print $2}' /proc/self/status)))
  names=$(capsh --decode="$(printf '%x' "$bnd")" 2>/dev/null | sed 's/.*=//' | tr 'a-z' 'A-Z' | tr ',' '\n' | sed '/^$/d')
  if [[ -n $names ]]; then
    keep=$(printf '%s\n' $names | jq -R . | jq -sc .)
    tmp=$(mktemp "$file.XXXXXX")
    jq --argjson keep "$keep" "
      if $path then
        $path |= with_entries(.value |= map(select(. as \$c | \$keep | index(\$c))))
      else . end" "$file" > "$tmp"
    mv "$tmp" "$file"
  fi
}
if [[ ${cmd:-} == exec && -n $process && -f $process ]]; then
  keep "$process" .capabilities
elif [[ -n ${cmd:-} && -n $bundle && -f $bundle/config.json ]]; then
  keep "$bundle/config.json" .process.capabilities
fi
exec /usr/sbin/runc "$@"
