#!/usr/bin/env bash
# The Docker engine kind needs, run only while `make kind-e2e` runs, in a way that leaves the host's
# networking as it found it (the emulated cluster bridges network namespaces on this host, and the real
# node of `make e2e` runs its own containerd):
#
#   dockerd.sh start    start Debian's dockerd (docker.io 20.10) in the background unless one answers
#   dockerd.sh stop     remove kind's containers and network, stop that dockerd and its containerd
#   dockerd.sh check    say what the host has that it had not before `start` (exit 1 if anything)
#
# How it stays out of the way:
#   --iptables=false --ip6tables=false   no DOCKER chains, no FORWARD policy DROP, no NAT
#   --ip-forward=false --ip-masq=false   net.ipv4.ip_forward as it was; nothing reaches outside
#   --bridge=none                        no docker0; kind makes its own network, removed at `stop`
#   data and exec roots of its own       ~/.cache/netsense/kind/docker (images kept: a warm run
#                                        loads nothing) and /run/netsense-kind/docker
# Containers run through runc-caps.sh: runc, less the capabilities this host's bounding set lacks
# (Docker 20.10 would give a privileged container CAP_SYS_RESOURCE, which this VM does not have).
#
# dockerd starts its own containerd (under the exec root, not /run/containerd): Debian's containerd
# service, which the real node does not use either (tests/support/node.py runs a private one), is not
# started, configured or touched. The package's own service stays off: installing docker.io here runs
# with policy-rc.d denying service starts, and nothing enables it.
#
# Nodes reach each other over kind's bridge (layer 2) and the host reaches the API server through
# docker-proxy on 127.0.0.1; neither needs forwarding or NAT on the host.
set -euo pipefail

CACHE=${NETSENSE_CACHE:-$HOME/.cache/netsense}/kind
DATA=$CACHE/docker
RUN=/run/netsense-kind
EXEC=$RUN/docker
SOCK=$RUN/docker.sock
PIDFILE=$RUN/dockerd.pid
LOG=$CACHE/dockerd.log
BEFORE=$RUN/host-before
export DOCKER_HOST=unix://$SOCK
# Debian's client (20.10) for Debian's engine, ahead of any other docker on PATH.
export PATH=/usr/bin:/usr/sbin:$PATH

host_state() {  # what dockerd could change on the host, one item a line
  iptables -S FORWARD | head -1
  iptables-save | grep -E '^(:|-A).*DOCKER' || true
  sysctl -n net.ipv4.ip_forward | sed 's/^/ip_forward=/'
  [[ -e /proc/sys/net/bridge/bridge-nf-call-iptables ]] && sysctl -n net.bridge.bridge-nf-call-iptables | sed 's/^/bridge-nf-call-iptables=/'
  ip -o link show type bridge | awk -F': ' '{print "bridge " $2}' | grep -E 'bridge (docker0|br-)' || true
  ip -o link show type veth | awk -F': ' '{print "veth " $2}' | sed 's/@.*//' | grep -E '^veth veth[0-9a-f]{7}$' || true
}

running() { [[ -S $SOCK ]] && docker info >/dev/null 2>&1; }

start() {
  if running; then echo "dockerd: already running ($SOCK)" >&2; return 0; fi
  command -v dockerd >/dev/null || { echo "dockerd: not installed (testbed/install-deps.sh --kind)" >&2; exit 1; }
  mkdir -p "$DATA" "$EXEC" "$(dirname "$LOG")"
  [[ -f $BEFORE ]] || host_state > "$BEFORE"
  # A config file of its own: an /etc/docker/daemon.json cannot turn iptables or forwarding back on.
  echo '{}' > "$RUN/daemon.json"
  install -m 0755 "$(dirname "$0")/runc-caps.sh" "$RUN/runc-caps"
  setsid nohup dockerd --config-file "$RUN/daemon.json" \
    --host "unix://$SOCK" --pidfile "$PIDFILE" --data-root "$DATA" --exec-root "$EXEC" \
    --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false --bridge=none \
    --add-runtime "caps-runc=$RUN/runc-caps" --default-runtime caps-runc \
    --storage-driver overlay2 --log-driver json-file --default-cgroupns-mode private \
    >"$LOG" 2>&1 < /dev/null &
  local i
  for ((i = 0; i < 60; i++)); do
    running && { echo "dockerd: up ($SOCK, data in $DATA)" >&2; return 0; }
    kill -0 $! 2>/dev/null || break
    sleep 1
  done
  echo "dockerd: did not come up; the end of $LOG:" >&2
  tail -20 "$LOG" >&2
  exit 1
}

stop() {
  if running; then
    local ids
    ids=$(docker ps -aq --filter label=io.x-k8s.kind.cluster)
    [[ -z $ids ]] || docker rm -f -v $ids >/dev/null
    docker network rm kind >/dev/null 2>&1 || true
    docker volume prune -f >/dev/null 2>&1 || true
  fi
  if [[ -f $PIDFILE ]]; then
    local pid
    pid=$(cat "$PIDFILE")
    kill "$pid" 2>/dev/null || true
    for ((i = 0; i < 30; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  # its containerd (a child that may outlive it for a moment) and shims
  local left
  for ((i = 0; i < 15; i++)); do
    left=$(pgrep -f "$EXEC" || true)
    [[ -z $left ]] && break
    sleep 1
  done
  [[ -z ${left:-} ]] || kill -9 $left 2>/dev/null || true
  # a killed dockerd can leave its network's bridge and the exec root's mounts
  local br m
  for br in $(ip -o link show type bridge | awk -F': ' '{print $2}' | grep -E '^br-[0-9a-f]{12}$' || true); do
    ip link delete "$br" 2>/dev/null || true
  done
  for m in $(awk -v run="$RUN" -v data="$DATA/" 'index($2, run) == 1 || index($2, data) == 1 {print $2}' /proc/mounts | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
  check
}

check() {
  local now diff
  now=$(host_state)
  if [[ -f $BEFORE ]]; then
    diff=$(diff <(cat "$BEFORE") <(echo "$now") || true)
  else
    diff=$(echo "$now" | grep -E 'DOCKER|docker0|br-|veth' || true)
  fi
  if [[ -n $diff ]]; then
    echo "dockerd: the host differs from before dockerd started:" >&2
    echo "$diff" >&2
    return 1
  fi
  if [[ -f $PIDFILE ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    echo "dockerd: still running" >&2
    return 1
  fi
  rm -rf "$RUN"
  echo "dockerd: stopped; host as before ($(iptables -S FORWARD | head -1), no DOCKER rules, no bridges or veths left)" >&2
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  check) check ;;
  env) echo "export DOCKER_HOST=$DOCKER_HOST" ;;
  *) echo "usage: dockerd.sh start | stop | check | env" >&2; exit 2 ;;
esac
