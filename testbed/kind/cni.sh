#!/usr/bin/env bash
# The pods' network on the kind nodes, in place of kindnetd (whose Go module is not served here):
# on each node, Debian's bridge + host-local CNI plugins (in the node image) on the pod CIDR the
# controller-manager gave that node, and a route to every other node's pod CIDR through that node's
# address on kind's Docker network. Layer 2 between the nodes, nothing on the host: no NAT, no
# forwarding on the host. Idempotent; run after `kind create cluster` and after a node restarts.
#   cni.sh <cluster name>     (KUBECONFIG and DOCKER_HOST as e2e.sh sets them)
set -euo pipefail
cluster=${1:?usage: cni.sh <cluster name>}
DOCKER=/usr/bin/docker
nodes=$(kind get nodes --name "$cluster")
declare -A cidr ip
for node in $nodes; do
  for ((i = 0; i < 60; i++)); do
    cidr[$node]=$(kubectl get node "$node" -o jsonpath='{.spec.podCIDR}' 2>/dev/null || true)
    [[ -n ${cidr[$node]} ]] && break
    sleep 1
  done
  [[ -n ${cidr[$node]} ]] || { echo "cni: node $node has no pod CIDR after 60s" >&2; exit 1; }
  ip[$node]=$($DOCKER inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$node")
done
for node in $nodes; do
  gw=${cidr[$node]%/*}; gw=${gw%.*}.1
  $DOCKER exec -i "$node" sh -c 'mkdir -p /etc/cni/net.d && cat > /etc/cni/net.d/10-netsense.conflist' <<JSON
{"cniVersion": "0.4.0", "name": "netsense-kind",
 "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "${cidr[$node]}", "gateway": "$gw"}]],
            "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
JSON
  $DOCKER exec "$node" sysctl -qw net.ipv4.ip_forward=1
  for other in $nodes; do
    [[ $other == "$node" ]] && continue
    $DOCKER exec "$node" ip route replace "${cidr[$other]}" via "${ip[$other]}"
  done
  echo "cni: $node ${ip[$node]} pods ${cidr[$node]}" >&2
done
