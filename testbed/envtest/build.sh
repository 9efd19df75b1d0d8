#!/usr/bin/env bash
# Builds the control-plane binaries the operator tests run against (the way
# controller-runtime's envtest runs them): kube-apiserver and etcd, plus
# kubectl to render kustomizations; from Go modules, CGO off, with version
# ldflags. Prints the directory holding them. `build.sh --kwok` adds kwok (simulated
# nodes, for scale measurements; no test needs it, so a cold CI run does not pay its
# three minutes).
#
# `build.sh --node` builds, in addition, what a real node needs (testbed/node):
# kubelet, kube-scheduler, kube-controller-manager, kube-proxy (same module graph)
# and CoreDNS; it prints the node binaries' directory (~/.cache/netsense/node/...),
# whose kube-apiserver, etcd and kubectl are links to the envtest ones.
#
# Why wrapper modules: k8s.io/kubernetes's go.mod requires its staging modules
# (k8s.io/api, k8s.io/apiserver, ...) at v0.0.0 and points them at ./staging with
# replace lines, which only apply inside its own repository. `go install
# k8s.io/kubernetes/cmd/kube-apiserver@v1.X.Y` is therefore refused. A throw-away
# module that requires k8s.io/kubernetes and replaces every staging module with its
# published v0.X.Y release builds the same code. etcd's server module has replace
# lines too, so it gets a wrapper of its own; so does kwok.
#
# `build.sh --kind` builds what testbed/kind needs besides the node binaries: kubeadm (same
# module graph as kubelet, into the node binaries' directory) and kind itself (its Go module,
# KIND_VERSION, into ~/.cache/netsense/kind/kind-<version>/bin); it prints kind's directory.
#
# Results are cached in ~/.cache/netsense/envtest/<versions>/bin: a warm machine
# builds nothing. If KUBEBUILDER_ASSETS is set and holds the binaries, it is used.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
KWOK_VERSION=${KWOK_VERSION:-v0.8.0}
COREDNS_VERSION=${COREDNS_VERSION:-v1.15.0}
KIND_VERSION=${KIND_VERSION:-v0.33.0}
NODE_CMDS=(kubelet kube-scheduler kube-controller-manager kube-proxy)

if [[ "${1:-}" == --kind ]]; then
  node_bin=$(bash "$0" --node)
  kind_bin=${NETSENSE_CACHE:-$HOME/.cache/netsense}/kind/kind-${KIND_VERSION}/bin
  if [[ -x $node_bin/kubeadm && -x $kind_bin/kind ]]; then echo "$kind_bin"; exit 0; fi
  command -v go >/dev/null || { echo "kind: Go is needed to build kind and kubeadm: https://go.dev/doc/install" >&2; exit 1; }
  mkdir -p "$kind_bin"
fi

if [[ "${1:-}" == --node ]]; then
  envtest_bin=$(bash "$0")
  node_bin=${NETSENSE_CACHE:-$HOME/.cache/netsense}/node/k8s-${K8S_VERSION}_coredns-${COREDNS_VERSION}/bin
  missing=0
  for cmd in "${NODE_CMDS[@]}" coredns; do [[ -x $node_bin/$cmd ]] || missing=1; done
  if ((missing == 0)); then echo "$node_bin"; exit 0; fi
fi

if [[ "${1:-}" != --node && "${1:-}" != --kind && -n "${KUBEBUILDER_ASSETS:-}" && -x "$KUBEBUILDER_ASSETS/kube-apiserver" && -x "$KUBEBUILDER_ASSETS/etcd" \
      && -x "$KUBEBUILDER_ASSETS/kubectl" ]]; then
  echo "$KUBEBUILDER_ASSETS"
  exit 0
fi

cache=${NETSENSE_CACHE:-$HOME/.cache/netsense}/envtest/k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}
bin=$cache/bin
# (The directory keeps kwok's version in its name whether kwok is built or not: one cache key for both.)
if [[ "${1:-}" != --node && "${1:-}" != --kind && -x $bin/kube-apiserver && -x $bin/kubectl && -x $bin/etcd \
      && ( "${1:-}" != --kwok || -x $bin/kwok ) ]]; then
  echo "$bin"
  exit 0
fi
command -v go >/dev/null || { echo "envtest: Go is needed to build kube-apiserver, etcd and kubectl (none on PATH): https://go.dev/doc/install" >&2; exit 1; }
mkdir -p "$bin"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local
start=$SECONDS
log() { echo "envtest: $* ($((SECONDS - start))s)" >&2; }

# wrapper <name> <module@version>: a throw-away module that requires it; the shell is left inside.
wrapper() {
  mkdir -p "$work/$1" && cd "$work/$1"
  go mod init "netsense.dev/envtest/$1" >/dev/null 2>&1
  go mod edit -require="$2"
}

# build_kube <bin dir> <cmd>...: commands of k8s.io/kubernetes (cmd/<name>).
build_kube() {
  local out=$1 minor=${K8S_VERSION#v1.}
  shift
  minor=${minor%%.*}
  local staging=v0.${K8S_VERSION#v1.}
  wrapper kube "k8s.io/kubernetes@$K8S_VERSION"
  local gomod
  gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  # Every staging module is required at v0.0.0 upstream: map each to its release.
  grep -oE '^\s*k8s\.io/[a-z0-9-]+ v0\.0\.0$' "$gomod" | awk '{print $1}' | sort -u |
    while read -r m; do go mod edit -replace="$m=$m@$staging"; done
  local pkg=k8s.io/component-base/version cmd
  for cmd in "$@"; do
    [[ -x $out/$cmd ]] && continue
    log "building $cmd $K8S_VERSION"
    go build -trimpath -o "$out/$cmd" -ldflags "-s -w \
      -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor \
      -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z" \
      "k8s.io/kubernetes/cmd/$cmd"
  done
}

build_etcd() {
  wrapper etcd "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  log "building etcd $ETCD_VERSION"
  go build -trimpath -o "$bin/etcd" -ldflags "-s -w" go.etcd.io/etcd/server/v3
}

build_kwok() {
  wrapper kwok "sigs.k8s.io/kwok@$KWOK_VERSION"
  log "building kwok $KWOK_VERSION"
  go build -trimpath -o "$bin/kwok" -ldflags "-s -w \
    -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok
}

build_coredns() {
  wrapper coredns "github.com/coredns/coredns@$COREDNS_VERSION"
  log "building coredns $COREDNS_VERSION"
  go build -trimpath -o "$1/coredns" -ldflags "-s -w" github.com/coredns/coredns
}

build_kind() {
  wrapper kind "sigs.k8s.io/kind@$KIND_VERSION"
  log "building kind $KIND_VERSION"
  go build -trimpath -o "$1/kind" -ldflags "-s -w" sigs.k8s.io/kind
}

if [[ "${1:-}" == --kind ]]; then
  [[ -x $node_bin/kubeadm ]] || build_kube "$node_bin" kubeadm
  [[ -x $kind_bin/kind ]] || build_kind "$kind_bin"
  log "done: $kind_bin (kubeadm in $node_bin)"
  echo "$kind_bin"
  exit 0
fi
if [[ "${1:-}" == --node ]]; then
  mkdir -p "$node_bin"
  build_kube "$node_bin" "${NODE_CMDS[@]}"
  [[ -x $node_bin/coredns ]] || build_coredns "$node_bin"
  for cmd in kube-apiserver etcd kubectl; do ln -sf "$envtest_bin/$cmd" "$node_bin/$cmd"; done
  log "done: $node_bin"
  echo "$node_bin"
  exit 0
fi
[[ -x $bin/etcd ]] || build_etcd
# kubectl comes from the same module graph: the tests render kustomizations with it.
[[ -x $bin/kube-apiserver && -x $bin/kubectl ]] || build_kube "$bin" kube-apiserver kubectl
[[ "${1:-}" != --kwok || -x $bin/kwok ]] || build_kwok
log "done: $bin"
echo "$bin"
