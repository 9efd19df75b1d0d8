#!/usr/bin/env bash
# The kind node image, built on this machine from what the registries serve (Docker Hub and
# registry.k8s.io, where kindest/base, kindest/node and the control-plane images live, are not
# reachable here). Needs the Docker engine of testbed/kind/dockerd.sh (DOCKER_HOST set by it).
#
#   images.sh base     the equivalent of kindest/base: Debian bookworm by mmdebstrap with systemd,
#                      Debian's containerd 1.6, runc and CNI plugins, iptables, conntrack...; and
#                      kind's own entrypoint, units and containerd config from the kind module's
#                      source (images/base/files of sigs.k8s.io/kind@KIND_VERSION; base-hook.sh)
#   images.sh node     the node image: that base, kubeadm/kubelet/kubectl, and every image the
#                      cluster runs imported into the node's containerd (k8s.io namespace):
#                        registry.k8s.io/kube-{apiserver,controller-manager,scheduler,proxy}:K8S_VERSION
#                        docker.io/netsense/etcd:ETCD_VERSION, docker.io/netsense/coredns:COREDNS_VERSION
#                        docker.io/netsense/pause:dev (testbed/node/pause.c; containerd's sandbox image)
#                      all from the binaries testbed/envtest/build.sh --node/--kind builds from Go modules.
#   images.sh all      both (each skipped when its tag is already in Docker's store)
#   images.sh name     print the node image's tag
#
# Why not `kind build node-image`: its builder (v0.33) takes Kubernetes from a source tree or a
# release tarball, but fetches every other image the cluster needs (etcd, CoreDNS, pause, kindnetd,
# local-path-provisioner) with `ctr content fetch` from their registries inside the build container,
# with no option for local archives; none of those registries is reachable here. This script does
# what that builder does (copy the binaries to /usr/bin, write /kind/version, import the images
# with containerd inside a build container, commit with kind's entrypoint) with local pieces.
# kindnetd and local-path-provisioner are left out: their Go modules are not served here
# (sigs.k8s.io/kindnet: 403 from the module proxy). The cluster uses disableDefaultCNI and
# testbed/kind/cni.sh (bridge + host-local from Debian's plugins, routes between the nodes), and
# kind falls back to its built-in host-path StorageClass (nothing here uses volumes).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH=$PATH:/usr/local/go/bin
[[ -n ${DOCKER_HOST:-} ]] || eval "$(bash testbed/kind/dockerd.sh env)"
DOCKER=/usr/bin/docker  # Debian's client, of the engine's version
KIND_VERSION=${KIND_VERSION:-v0.33.0}
K8S_VERSION=${K8S_VERSION:-v1.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
COREDNS_VERSION=${COREDNS_VERSION:-v1.15.0}
# Keyed by the versions and by this script and the hook: a change to either rebuilds.
KEY=$(cat testbed/kind/images.sh testbed/kind/base-hook.sh testbed/node/pause.c | sha1sum | cut -c1-8)
BASE=localhost/netsense/kind-base:bookworm-kind-${KIND_VERSION}-$KEY
NODE=localhost/netsense/kind-node:${K8S_VERSION}-$KEY
PACKAGES=systemd,conntrack,iptables,nftables,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,pigz,bash,ca-certificates,curl,jq,procps,containerd,runc,containernetworking-plugins
start=$SECONDS
log() { echo "kind images: $* ($((SECONDS - start))s)" >&2; }
have() { $DOCKER image inspect "$1" >/dev/null 2>&1; }

kind_src() {
  go mod download -json "sigs.k8s.io/kind@$KIND_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p'
}

base() {
  have "$BASE" && return 0
  local src
  src=$(kind_src)
  [[ -d $src/images/base/files ]] || { echo "kind images: no kind source at '$src'" >&2; exit 1; }
  log "bootstrapping $BASE (mmdebstrap; kind's files from $src)"
  mmdebstrap --quiet --variant=minbase --include="$PACKAGES" \
    --customize-hook="bash testbed/kind/base-hook.sh \"\$1\" $src" \
    bookworm - http://deb.debian.org/debian |
    $DOCKER import --change 'ENV container=docker' \
      --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' - "$BASE-unsigned" >/dev/null
  # docker import cannot set STOPSIGNAL (systemd stops on SIGRTMIN+3, as in kind's Dockerfile)
  printf 'FROM %s\nSTOPSIGNAL SIGRTMIN+3\n' "$BASE-unsigned" | $DOCKER build -q -t "$BASE" - >/dev/null
  $DOCKER rmi "$BASE-unsigned" >/dev/null
  log "built $BASE"
}

# component <tag> <binary> [entrypoint]: a FROM-scratch image with one static binary in /usr/local/bin.
component() {
  local tag=$1 bin=$2 entry=${3:-} ctx
  ctx=$(mktemp -d)
  cp "$bin" "$ctx/"
  {
    echo "FROM scratch"
    echo "COPY ${bin##*/} /usr/local/bin/${bin##*/}"
    echo "ENV PATH=/usr/local/bin:/usr/bin:/bin"
    echo "WORKDIR /tmp"
    echo "WORKDIR /"
    [[ -n $entry ]] && echo "ENTRYPOINT [\"/usr/local/bin/${bin##*/}\"]"
  } > "$ctx/Dockerfile"
  $DOCKER build -q -t "$tag" "$ctx" >/dev/null
  rm -rf "$ctx"
}

node() {
  have "$NODE" && return 0
  base
  local kind_bin node_bin
  kind_bin=$(bash testbed/envtest/build.sh --kind)
  node_bin=$(bash testbed/envtest/build.sh --node)
  log "building the control-plane, etcd, CoreDNS and pause images"
  local cp images=()
  for cp in kube-apiserver kube-controller-manager kube-scheduler; do
    component "registry.k8s.io/$cp:$K8S_VERSION" "$node_bin/$cp"
    images+=("registry.k8s.io/$cp:$K8S_VERSION")
  done
  # kube-proxy runs iptables and conntrack: on the base (Debian's iptables, as the node's).
  local ctx
  ctx=$(mktemp -d)
  cp "$node_bin/kube-proxy" "$ctx/"
  printf 'FROM %s\nCOPY kube-proxy /usr/local/bin/kube-proxy\nENTRYPOINT []\nCMD ["/usr/local/bin/kube-proxy"]\n' "$BASE" > "$ctx/Dockerfile"
  $DOCKER build -q -t "registry.k8s.io/kube-proxy:$K8S_VERSION" "$ctx" >/dev/null
  rm -rf "$ctx"
  images+=("registry.k8s.io/kube-proxy:$K8S_VERSION")
  component "docker.io/netsense/etcd:$ETCD_VERSION" "$(readlink -f "$node_bin/etcd")"
  # kubeadm's CoreDNS Deployment runs the image's entrypoint with -conf: /coredns, as upstream.
  ctx=$(mktemp -d)
  cp "$node_bin/coredns" "$ctx/"
  printf 'FROM scratch\nCOPY coredns /coredns\nENTRYPOINT ["/coredns"]\n' > "$ctx/Dockerfile"
  $DOCKER build -q -t "docker.io/netsense/coredns:$COREDNS_VERSION" "$ctx" >/dev/null
  rm -rf "$ctx"
  images+=("docker.io/netsense/etcd:$ETCD_VERSION" "docker.io/netsense/coredns:$COREDNS_VERSION")
  ctx=$(mktemp -d)
  gcc -static -O2 -o "$ctx/pause" testbed/node/pause.c
  $DOCKER build -q -f testbed/node/pause.Containerfile -t docker.io/netsense/pause:dev "$ctx" >/dev/null
  rm -rf "$ctx"
  images+=(docker.io/netsense/pause:dev)

  log "assembling $NODE"
  local cid
  cid=$($DOCKER run -d --entrypoint=sleep --security-opt seccomp=unconfined "$BASE" infinity)
  trap '$DOCKER rm -f -v '"$cid"' >/dev/null 2>&1 || true' EXIT
  local b
  for b in kubeadm kubelet kubectl; do
    $DOCKER cp "$(readlink -f "$node_bin/$b")" "$cid:/usr/bin/$b"
    $DOCKER exec "$cid" chmod 0755 "/usr/bin/$b"
  done
  $DOCKER exec "$cid" sh -c "echo $K8S_VERSION > /kind/version"
  $DOCKER exec "$cid" bash -c 'nohup containerd > /dev/null 2>&1 &'
  $DOCKER exec "$cid" bash -c 'for i in $(seq 30); do ctr version >/dev/null 2>&1 && exit 0; sleep 1; done; exit 1'
  local img
  for img in "${images[@]}"; do
    $DOCKER save "$img" | $DOCKER exec -i "$cid" ctr --namespace=k8s.io images import \
      --label=io.cri-containerd.pinned=pinned --all-platforms --no-unpack --digests - >/dev/null
  done
  $DOCKER exec "$cid" ctr --namespace=k8s.io images list -q >&2
  $DOCKER exec "$cid" pkill containerd || true
  sleep 2
  $DOCKER commit --change 'ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]' "$cid" "$NODE" >/dev/null
  # the component images live on inside the node image; Docker's own copies are not needed
  $DOCKER rmi "${images[@]}" >/dev/null 2>&1 || true
  log "built $NODE"
  prune
}

# the node and base images of other keys (an earlier version of this script), and dangling layers
prune() {
  local old
  old=$($DOCKER images --format '{{.Repository}}:{{.Tag}}' | grep -E '^localhost/netsense/kind-(base|node):' |
    grep -vxF -e "$BASE" -e "$NODE" || true)
  [[ -z $old ]] || $DOCKER rmi $old >/dev/null 2>&1 || true
  $DOCKER image prune -f >/dev/null 2>&1 || true
}

case "${1:-all}" in
  base) base ;;
  node) node ;;
  all) node ;;
  name) echo "$NODE" ;;
  *) echo "usage: images.sh [base | node | all | name]" >&2; exit 2 ;;
esac
