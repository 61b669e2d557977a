#!/usr/bin/env bash
# Run Unwind for real on this machine: install, start the local control plane (etcd,
# kube-apiserver, kube-controller-manager) and its node (kubelet, containerd, scheduler,
# kube-proxy), install the CRDs and the Helm chart (the operator as a Deployment of the image
# built here, on that node), then `kubectl apply -f manifests/` and wait until every
# ToolManifest is Ready.
# Stop it with: .venv/bin/unwind dev down
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/install.sh
.venv/bin/unwind dev up --dir .dev
export KUBECONFIG="$root/.dev/cluster/kubeconfig"
kubectl apply -f manifests/
kubectl wait --for=condition=Ready toolmanifests --all -A --timeout=120s
kubectl get toolmanifests -A
echo
echo "export KUBECONFIG=$KUBECONFIG PATH=$root/.venv/bin:\$PATH    # kubectl and kubectl unwind against it"
echo "then: kubectl apply -f examples/demo-agent.yaml    # an agent's run to plan and roll back (README: The whole story)"
