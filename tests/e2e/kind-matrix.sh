#!/usr/bin/env bash
# Run tests/e2e/kind-e2e.sh once per Kubernetes version, on kind.
#
# For machines with a Docker engine and kind; it was NOT run on the development machines of
# this repository (no Docker there; see docs/compatibility.md for what was run instead).
#
# Usage: tests/e2e/kind-matrix.sh [NODE_IMAGE...]
# Default node images: the supported range, 1.29 (native sidecars on by default) to 1.33.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
images=("$@")
if ((${#images[@]} == 0)); then
  images=(kindest/node:v1.29.14 kindest/node:v1.31.6 kindest/node:v1.33.1)
fi
failed=()
for image in "${images[@]}"; do
  version="${image##*:}"
  printf '\n######## %s\n' "${image}"
  if ! CLUSTER_NAME="unwind-e2e-${version//./-}" KIND_NODE_IMAGE="${image}" bash "${here}/kind-e2e.sh"; then
    failed+=("${image}")
  fi
done
if ((${#failed[@]})); then
  printf '\nfailed on: %s\n' "${failed[*]}" >&2
  exit 1
fi
printf '\npassed on: %s\n' "${images[*]}"
