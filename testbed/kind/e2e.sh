#!/usr/bin/env bash
# make kind-e2e: a 3-node kind cluster (one control plane, two workers) built on this machine from what the
# registries serve, the operator deployed from manifests/, and the end-to-end tests that need more than one
# node (tests/e2e/test_kind.py, marker `kind`). Root. Steps, each cached where it can be:
#
#   1. Debian packages (testbed/install-deps.sh --kind: docker.io, jq, libcap2-bin and the real node's),
#      kind and kubeadm from Go modules (testbed/envtest/build.sh --kind; ~/.cache/netsense/kind/kind-<version>),
#      the netsense images (testbed/node/images.sh, podman: the same images as `make e2e`)
#   2. dockerd, run so that the host's networking stays as it was (testbed/kind/dockerd.sh)
#   3. the node image (testbed/kind/images.sh: a kindest/base equivalent from Debian packages and kind's own
#      files, Kubernetes, etcd, CoreDNS and pause from Go modules; kept in Docker's store, keyed)
#   4. kind create cluster (testbed/kind/cluster.yaml), the pods' network (testbed/kind/cni.sh), the
#      netsense images loaded onto the workers with `kind load image-archive`
#   5. pytest -m kind tests/e2e/test_kind.py: it deploys the operator (manifests/overlays/local) itself
#
# At the end, passed or failed: the cluster deleted, dockerd stopped, and a check that the host has no
# containers, bridges, veths, DOCKER iptables rules or changed forwarding left (dockerd.sh stop; its exit
# status fails the run). KEEP=1 keeps the cluster and dockerd running instead; `make kind-down` removes
# them later. Environment: KEEP, CLUSTER (netsense-e2e), PYTEST_ARGS (extra pytest arguments).
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
CLUSTER=${CLUSTER:-netsense-e2e}
KEEP=${KEEP:-0}
t0=$SECONDS
step() { echo "--- kind-e2e: $* ($((SECONDS - t0))s)" >&2; }
[[ $(id -u) == 0 ]] || { echo "kind-e2e: needs root (dockerd, the node containers)" >&2; exit 1; }

step "packages, kind, kubeadm and the netsense images"
bash testbed/install-deps.sh --kind
kind_bin=$(bash testbed/envtest/build.sh --kind)
node_bin=$(bash testbed/envtest/build.sh --node)
bash testbed/node/images.sh build

# One PATH for every step and for the tests: Debian's docker client (of the engine's version, ahead of any
# other docker), this kind, the kubectl of the server's version.
eval "$(bash testbed/kind/dockerd.sh env)"
tools=/run/netsense-kind/bin
export KUBECONFIG=/run/netsense-kind/kubeconfig
export NETSENSE_KIND_CLUSTER=$CLUSTER

cleanup() {
  local status=$? rc=0
  trap - EXIT INT TERM
  if [[ $status -ne 0 && -x $tools/kubectl && -f $KUBECONFIG ]]; then
    echo "--- kind-e2e failed ($status): the cluster as it was" >&2
    kubectl get nodes -o wide >&2 || true
    kubectl get nsj,pods -A -o wide >&2 || true
    kubectl -n netsense-system logs deploy/netsense-operator --tail=60 >&2 || true
  fi
  if [[ $KEEP == 1 ]]; then
    echo "--- kind-e2e: KEEP=1: cluster $CLUSTER and dockerd left running; to use them:" >&2
    echo "  $(bash testbed/kind/dockerd.sh env); export KUBECONFIG=$KUBECONFIG PATH=$tools:\$PATH" >&2
    echo "  make kind-down   # deletes the cluster and stops dockerd" >&2
    exit $status
  fi
  step "tearing down"
  if [[ -x $tools/kind ]] && docker info >/dev/null 2>&1; then
    kind delete cluster --name "$CLUSTER" >&2 || rc=1
    # what `make kind-e2e` promises to leave: no cluster, no container (dockerd.sh then checks the host)
    left=$(kind get clusters 2>/dev/null; docker ps -aq)
    [[ -z $left ]] || { echo "kind-e2e: left after delete: $left" >&2; rc=1; }
  fi
  bash testbed/kind/dockerd.sh stop || rc=1
  rm -rf "$tools"
  step "done (tests: exit $status; teardown: $([[ $rc == 0 ]] && echo clean || echo 'left something, see above'))"
  ((status != 0)) && exit $status
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step "dockerd"
bash testbed/kind/dockerd.sh start
mkdir -p "$tools"
ln -sf /usr/bin/docker "$tools/docker"
ln -sf "$kind_bin/kind" "$tools/kind"
ln -sf "$(readlink -f "$node_bin/kubectl")" "$tools/kubectl"
export PATH=$tools:$PATH

step "the node image"
bash testbed/kind/images.sh node
image=$(bash testbed/kind/images.sh name)

if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  step "cluster $CLUSTER exists (KEEP=1 earlier): reusing it"
  kind export kubeconfig --name "$CLUSTER" >/dev/null
else
  step "kind create cluster ($image)"
  kind create cluster --config testbed/kind/cluster.yaml --name "$CLUSTER" --image "$image"
fi
bash testbed/kind/cni.sh "$CLUSTER"
kubectl wait --for=condition=Ready nodes --all --timeout=180s

step "loading the netsense images onto the workers (kind load image-archive)"
workers=$(kind get nodes --name "$CLUSTER" | grep -v control-plane | paste -sd, -)
archives=${NETSENSE_CACHE:-$HOME/.cache/netsense}/kind/archives
mkdir -p "$archives"
for name in operator shaper worker; do
  id=$(podman image inspect --format '{{.Id}}' "docker.io/netsense/$name:dev")
  # a kept cluster may have it already (by podman's image ID)
  have=1
  for node in ${workers//,/ }; do
    docker exec "$node" ctr -n k8s.io images ls "name==docker.io/netsense/$name:dev" 2>/dev/null |
      grep -q "netsense.dev/podman-id=$id" || have=0
  done
  ((have)) && continue
  # the archive only while it loads: the worker's is several GB
  podman save --format docker-archive -o "$archives/$name.tar" "docker.io/netsense/$name:dev"
  kind load image-archive "$archives/$name.tar" --name "$CLUSTER" --nodes "$workers"
  rm -f "$archives/$name.tar"
  for node in ${workers//,/ }; do
    docker exec "$node" ctr -n k8s.io images label "docker.io/netsense/$name:dev" "netsense.dev/podman-id=$id" >/dev/null
  done
done

step "the multi-node tests"
# shellcheck disable=SC2086
"$REPO/.venv/bin/pytest" -q -ra -s -m kind --timeout 1500 --durations=10 tests/e2e/test_kind.py ${PYTEST_ARGS:-}
