#!/usr/bin/env bash
# make kind-e2e: kind cluster -> images -> operator -> the quick sample -> Succeeded.
# Needs Docker, kind and kubectl. KEEP=1 keeps the cluster afterwards.
set -euo pipefail
cd "$(dirname "$0")/../.."
CLUSTER=${CLUSTER:-netsense-e2e}
TIMEOUT=${TIMEOUT:-900s}
for tool in docker kind kubectl; do
  command -v "$tool" >/dev/null || { echo "kind-e2e: $tool is not installed" >&2; exit 1; }
done
docker info >/dev/null 2>&1 || { echo "kind-e2e: no Docker engine is running" >&2; exit 1; }

cleanup() {
  status=$?
  if [[ $status -ne 0 ]]; then
    echo "--- diagnostics"; kubectl get nsj,pods -A -o wide || true
    kubectl -n netsense-system logs deploy/netsense-operator --tail=100 || true
  fi
  [[ "${KEEP:-0}" == 1 ]] || kind delete cluster --name "$CLUSTER" || true
  exit $status
}
trap cleanup EXIT

kind get clusters | grep -qx "$CLUSTER" || kind create cluster --config testbed/kind/cluster.yaml --name "$CLUSTER"
kubectl config use-context "kind-$CLUSTER"

echo "--- building images"
docker build -f images/worker.Dockerfile -t netsense/worker:dev .
docker build -f images/operator.Dockerfile -t netsense/operator:dev .
docker build -f images/shaper.Dockerfile -t netsense/shaper:dev .
kind load docker-image netsense/worker:dev netsense/operator:dev netsense/shaper:dev --name "$CLUSTER"

echo "--- deploying the operator"
kubectl apply -k manifests/overlays/local
kubectl wait --for=condition=Established crd/netsensejobs.netsense.dev --timeout=60s
kubectl -n netsense-system rollout status deploy/netsense-operator --timeout=180s

echo "--- running the quick sample"
kubectl delete -f manifests/samples/quick-local.yaml --ignore-not-found --wait
kubectl apply -f manifests/samples/quick-local.yaml
kubectl wait nsj/quick-digits --for=jsonpath='{.status.phase}'=Succeeded --timeout="$TIMEOUT"
kubectl get nsj quick-digits
kubectl get nsj quick-digits -o jsonpath='{.status.result}'; echo
