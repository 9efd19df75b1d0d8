#!/usr/bin/env bash
# Builds the images the local node runs, without Docker or a registry:
#   1. a Debian bookworm base with python3.11 and pip, bootstrapped by mmdebstrap from
#      Debian's own mirror (the public python:slim base is on Docker Hub, unreachable here);
#   2. images/{worker,operator,shaper}.Dockerfile built by podman on that base (BASE build
#      argument) and tagged :dev, as the kind overlay expects; the pause (sandbox) image
#      from testbed/node/pause.c.
# PyPI's torch is the CUDA build, so the local worker image is several GB (the
# Dockerfile's default index, PyTorch's CPU wheels, is not reachable here).
# podman's store (/var/lib/containers) caches the layers: a warm rebuild only re-runs
# the steps after the source COPY. `images.sh load <containerd socket>` imports every
# image into containerd's k8s.io namespace unless an image of the same ID is there.
set -euo pipefail
cd "$(dirname "$0")/../.."
BASE=localhost/netsense/base:bookworm
IMAGES=(worker operator shaper)
start=$SECONDS
log() { echo "images: $* ($((SECONDS - start))s)" >&2; }
for tool in podman mmdebstrap gcc; do
  command -v "$tool" >/dev/null || { echo "images: $tool is not installed (apt-get install podman mmdebstrap gcc)" >&2; exit 1; }
done

build() {
  if ! podman image exists "$BASE"; then
    log "bootstrapping $BASE (mmdebstrap)"
    # python3-pip on Debian refuses system-wide installs (PEP 668) unless told: the
    # Dockerfiles install into the image's system Python, as on python:slim. The base
    # trusts the CAs this machine added (/usr/local/share/ca-certificates: an egress
    # proxy's, where there is one), or pip inside the builds could not reach PyPI.
    local trust=()
    [[ -d /usr/local/share/ca-certificates ]] && trust=(
      --customize-hook='copy-in /usr/local/share/ca-certificates /usr/local/share'
      --customize-hook='chroot "$1" update-ca-certificates >/dev/null 2>&1')
    mmdebstrap --quiet --variant=minbase --include=python3,python3-pip,python-is-python3,ca-certificates \
      "${trust[@]}" bookworm - http://deb.debian.org/debian |
      podman import --change 'ENV PIP_BREAK_SYSTEM_PACKAGES=1' --change 'ENV PIP_ROOT_USER_ACTION=ignore' \
        --change 'CMD ["/bin/bash"]' - "$BASE" >/dev/null
  fi
  local name
  for name in "${IMAGES[@]}"; do
    log "building netsense/$name:dev"
    local args=(--build-arg "BASE=$BASE")
    # PyTorch's CPU index is unreachable here: PyPI's (CUDA) wheels instead.
    [[ $name == worker ]] && args+=(--build-arg TORCH_INDEX=https://pypi.org/simple)
    podman build --quiet --network host "${args[@]}" -f "images/$name.Dockerfile" -t "docker.io/netsense/$name:dev" . >/dev/null
  done
  log "building the pause image"
  local ctx
  ctx=$(mktemp -d)
  gcc -static -O2 -o "$ctx/pause" testbed/node/pause.c
  podman build --quiet -f testbed/node/pause.Containerfile -t docker.io/netsense/pause:dev "$ctx" >/dev/null
  rm -rf "$ctx"
  podman image prune -f >/dev/null  # the layers of earlier :dev builds
  log "done"
}

# load <socket>: import into containerd (k8s.io namespace) what it lacks, by image ID.
load() {
  local sock=$1 name id have
  for name in "${IMAGES[@]}" pause; do
    id=$(podman image inspect --format '{{.Id}}' "docker.io/netsense/$name:dev")
    have=$(ctr --address "$sock" -n k8s.io images ls "name==docker.io/netsense/$name:dev" 2>/dev/null | tail -n +2)
    [[ $have == *"netsense.dev/podman-id=$id"* ]] && continue
    log "importing netsense/$name:dev into containerd"
    podman save --format docker-archive "docker.io/netsense/$name:dev" |
      ctr --address "$sock" -n k8s.io images import - >/dev/null
    ctr --address "$sock" -n k8s.io images label "docker.io/netsense/$name:dev" "netsense.dev/podman-id=$id" >/dev/null
  done
}

case "${1:-build}" in
  build) build ;;
  load) load "${2:?usage: images.sh load <containerd socket>}" ;;
  *) echo "usage: images.sh [build | load <containerd socket>]" >&2; exit 2 ;;
esac
