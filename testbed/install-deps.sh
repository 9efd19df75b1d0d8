#!/usr/bin/env bash
# What this project needs from Debian (12, bookworm) besides Python and Go, installed in one place: `make run`,
# `make test`, `make node`/`make e2e` and .ci/run all call it, so a fresh machine passes what the README says.
#
#   testbed/install-deps.sh           the emulated cluster and the tests: iproute2, procps, make, openssl, g++
#   testbed/install-deps.sh --node    and the real node of `make e2e`: containerd, runc, the CNI plugins,
#                                     iptables, podman, mmdebstrap
#   testbed/install-deps.sh --kind    and what `make kind-e2e` adds: docker.io (Debian's engine, 20.10; its
#                                     service is not started: testbed/kind/dockerd.sh runs it), jq, capsh
#
# Installs only what is missing (a warm machine runs no apt at all). Not root, or not Debian: it names the one
# command to run and stops. Go (for the envtest and node binaries) is checked, not installed: Debian 12's is too
# old for Kubernetes 1.37 (https://go.dev/doc/install).
set -euo pipefail

node=0 kind=0
[[ "${1:-}" == --node ]] && node=1
[[ "${1:-}" == --kind ]] && node=1 kind=1

need=()
want() {  # want COMMAND-OR-PATH PACKAGE
  if [[ $1 == /* ]]; then [[ -e $1 ]] || need+=("$2"); else command -v "$1" >/dev/null || need+=("$2"); fi
}
want ip iproute2
want tc iproute2
want pgrep procps
want make make
want openssl openssl
want g++ g++          # the fused CPU compression kernels (netsense/compression/native.cpp)
if ((node)); then
  want containerd containerd
  want runc runc
  want /usr/lib/cni/bridge containernetworking-plugins
  want iptables iptables
  want podman podman
  want mmdebstrap mmdebstrap
fi
kind_need=()
if ((kind)); then
  command -v dockerd >/dev/null && [[ -x /usr/bin/docker ]] || kind_need+=(docker.io)
  command -v jq >/dev/null || kind_need+=(jq)
  command -v capsh >/dev/null || kind_need+=(libcap2-bin)
fi
mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u | sed '/^$/d')

if ((${#need[@]} + ${#kind_need[@]})); then
  if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
    echo "missing: ${need[*]} ${kind_need[*]}; install them with: apt-get install -y ${need[*]} ${kind_need[*]}" >&2
    exit 1
  fi
  echo "installing from Debian: ${need[*]} ${kind_need[*]}" >&2
  apt-get update -qq
fi
if ((${#need[@]})); then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
if ((${#kind_need[@]})); then
  # Debian's docker.io would start its service (with its iptables rules and FORWARD policy DROP) where an init
  # system runs: no service starts during this install; testbed/kind/dockerd.sh runs dockerd its own way.
  deny=0
  if ((kind)) && [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 0755 /usr/sbin/policy-rc.d && deny=1
  fi
  # Its recommends (cgroupfs-mount, needrestart, ...) would change the host more than kind needs.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${kind_need[@]}" >/dev/null
  if ((deny)); then rm -f /usr/sbin/policy-rc.d; fi
fi
if ((kind)); then
  # ... and at the next boot: the package enables docker.service and docker.socket. Masked, a host with systemd
  # never starts Debian's dockerd with its default rules; dockerd.sh starts its own and is not a service.
  for unit in docker.service docker.socket; do
    rm -f /etc/systemd/system/*.wants/"$unit"
    [[ -L /etc/systemd/system/$unit ]] || ln -sf /dev/null /etc/systemd/system/"$unit"
  done
fi

if ! command -v go >/dev/null && [[ -x /usr/local/go/bin/go ]]; then
  export PATH=$PATH:/usr/local/go/bin
fi
if [[ ${NETSENSE_NEED_GO:-0} == 1 ]] && ! command -v go >/dev/null; then
  echo "Go (>= 1.24) is needed to build kube-apiserver, etcd and kubectl for the tests: https://go.dev/doc/install" >&2
  exit 1
fi
exit 0
