#!/usr/bin/env bash
# The whole check, as CI runs it: install (idempotent), then ruff, mypy and every test,
# the cluster tests on a real kube-apiserver + etcd included.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/install.sh
echo "== ruff"
.venv/bin/ruff check operator tests benchmarks
echo "== mypy"
.venv/bin/mypy
echo "== unwind validate / lint / test (the pre-merge check on the examples)"
.venv/bin/unwind validate manifests/
.venv/bin/unwind lint --strict manifests/
.venv/bin/unwind test tests/contracts -m manifests/
echo "== pytest"
.venv/bin/pytest -p no:cacheprovider "$@"
