#!/usr/bin/env bash
# End-to-end check of the image and the chart on a throwaway kind cluster.
#
# For machines with a Docker engine; it was NOT run on the development machines
# of this repository (no Docker there). What it does:
#   1. builds the image from the repository's Dockerfile,
#   2. creates a kind cluster and loads the image into it,
#   3. installs charts/unwind (CRDs come from the chart's crds/ folder),
#   4. waits for the operator, applies manifests/ and waits until every
#      ToolManifest is Ready,
#   5. runs an agent as a Job labelled unwind.dev/inject=true (the demo agent of
#      examples/demo-agent.yaml) and waits until the Job completes: on 1.29+ its
#      gateway is a native sidecar, and the agent's container holds no token,
#   6. prints `kubectl get toolmanifests -A` and deletes the cluster on exit.
#
# tests/e2e/kind-matrix.sh runs it for several Kubernetes versions.
#
# Usage: tests/e2e/kind-e2e.sh
# Environment:
#   CLUSTER_NAME   kind cluster name            (default: unwind-e2e)
#   IMAGE          image to build and load      (default: unwind:e2e)
#   RELEASE        Helm release name            (default: unwind)
#   NAMESPACE      operator namespace           (default: unwind-system)
#   KIND_NODE_IMAGE  node image for kind         (default: kind's own default)
#   KEEP_CLUSTER=1 keep the cluster after the run, for debugging
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CLUSTER_NAME="${CLUSTER_NAME:-unwind-e2e}"
IMAGE="${IMAGE:-unwind:e2e}"
RELEASE="${RELEASE:-unwind}"
NAMESPACE="${NAMESPACE:-unwind-system}"

say() { printf '\n==> %s\n' "$*"; }
die() { printf 'kind-e2e: %s\n' "$*" >&2; exit 1; }

# --- prerequisites -----------------------------------------------------------
missing=()
for tool in docker kind helm kubectl; do
  command -v "${tool}" >/dev/null 2>&1 || missing+=("${tool}")
done
if ((${#missing[@]})); then
  die "missing required tools: ${missing[*]}. Install docker (a running engine), kind, helm (v3.8+) and kubectl, then re-run."
fi
docker info >/dev/null 2>&1 || die "docker is installed but the engine is not reachable (is the daemon running, may this user use it?)."
[[ -n "$(ls -A "${ROOT}/charts/unwind/crds" 2>/dev/null)" ]] \
  || die "charts/unwind/crds/ is empty: generate the CRDs first."

image_repo="${IMAGE%:*}"
image_tag="${IMAGE##*:}"
[[ "${image_repo}" != "${IMAGE}" ]] || die "IMAGE must be repository:tag, got '${IMAGE}'."

# A private kubeconfig, so the run never touches the user's contexts.
KUBECONFIG_FILE="$(mktemp -t unwind-e2e-kubeconfig.XXXXXX)"
export KUBECONFIG="${KUBECONFIG_FILE}"

# --- cleanup -----------------------------------------------------------------
cleanup() {
  local status=$?
  if ((status != 0)); then
    say "failed (exit ${status}); operator state for the record"
    kubectl -n "${NAMESPACE}" get pods -o wide 2>/dev/null || true
    kubectl -n "${NAMESPACE}" logs "deployment/${RELEASE}-operator" --tail=200 2>/dev/null || true
    kubectl get toolmanifests -A -o wide 2>/dev/null || true
  fi
  if [[ "${KEEP_CLUSTER:-0}" == "1" ]]; then
    say "KEEP_CLUSTER=1: cluster '${CLUSTER_NAME}' kept (KUBECONFIG=${KUBECONFIG_FILE})"
  else
    say "deleting kind cluster '${CLUSTER_NAME}'"
    kind delete cluster --name "${CLUSTER_NAME}" >/dev/null 2>&1 || true
    rm -f "${KUBECONFIG_FILE}"
  fi
  exit "${status}"
}
trap cleanup EXIT

# --- build, cluster, load ----------------------------------------------------
say "building image ${IMAGE}"
docker build -t "${IMAGE}" "${ROOT}"

say "creating kind cluster '${CLUSTER_NAME}'"
kind_args=(--name "${CLUSTER_NAME}" --kubeconfig "${KUBECONFIG_FILE}" --wait 120s)
[[ -n "${KIND_NODE_IMAGE:-}" ]] && kind_args+=(--image "${KIND_NODE_IMAGE}")
kind create cluster "${kind_args[@]}"

say "loading ${IMAGE} into the cluster"
kind load docker-image "${IMAGE}" --name "${CLUSTER_NAME}"

# --- install -----------------------------------------------------------------
say "installing chart charts/unwind as release '${RELEASE}' in '${NAMESPACE}'"
helm install "${RELEASE}" "${ROOT}/charts/unwind" \
  --namespace "${NAMESPACE}" --create-namespace \
  --set image.repository="${image_repo}" \
  --set image.tag="${image_tag}" \
  --set image.pullPolicy=Never \
  --wait --timeout 180s

say "waiting for the operator"
kubectl -n "${NAMESPACE}" rollout status "deployment/${RELEASE}-operator" --timeout=120s
kubectl wait --for=condition=Established crd --all --timeout=60s

# --- manifests ---------------------------------------------------------------
say "creating the namespaces manifests/ uses"
namespaces="$(grep -rhoE '^[[:space:]]+namespace:[[:space:]]*[a-z0-9-]+' "${ROOT}/manifests" \
  | awk '{print $2}' | sort -u)"
for ns in ${namespaces}; do
  kubectl create namespace "${ns}" --dry-run=client -o yaml | kubectl apply -f -
done

say "applying manifests/"
kubectl apply -f "${ROOT}/manifests/"

say "waiting until every ToolManifest is Ready"
kubectl wait --for=condition=Ready toolmanifest --all -A --timeout=120s

say "an agent run as a Job, with the injected gateway, completes"
kubectl apply -f "${ROOT}/examples/demo-agent.yaml" --dry-run=client -o json \
  | python3 -c '
import json, sys
items = json.load(sys.stdin)["items"]
pod = items[-1]
job = {"apiVersion": "batch/v1", "kind": "Job",
       "metadata": {"name": "e2e-agent", "namespace": pod["metadata"]["namespace"]},
       "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": pod["metadata"]["labels"]},
                                                "spec": pod["spec"]}}}
print(json.dumps({"apiVersion": "v1", "kind": "List", "items": [*items[:-1], job]}))' \
  | kubectl apply -f -
kubectl -n code-hosting wait --for=condition=complete job/e2e-agent --timeout=180s
agent_pod="$(kubectl -n code-hosting get pods -l job-name=e2e-agent -o jsonpath='{.items[0].metadata.name}')"
kubectl -n code-hosting get pod "${agent_pod}" -o json | python3 -c '
import json, sys
pod = json.load(sys.stdin)
gateway = [c["name"] for c in pod["spec"].get("initContainers", []) if c.get("restartPolicy") == "Always"]
agent = next(c for c in pod["spec"]["containers"] if c["name"] == "agent")
mounts = [m["mountPath"] for m in agent.get("volumeMounts", [])]
assert "/var/run/secrets/kubernetes.io/serviceaccount" not in mounts, mounts
print("gateway as a native sidecar:", gateway or "no (a plain container: server older than 1.29)")'

say "result"
kubectl get toolmanifests -A
say "e2e passed"
