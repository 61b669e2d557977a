#!/usr/bin/env bash
# Install everything Unwind's tests and `unwind dev up` need, on a fresh Debian machine with
# Go 1.26 or newer: a virtualenv with the project and its dev tools; the Debian packages
# (containerd, runc, CNI plugins, iptables, buildah, debootstrap, skopeo); the control plane's
# and the node's binaries (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kubectl; kubelet, kube-proxy) built from Go modules; and the project's image and a pause
# image built with buildah. Everything built is cached in ~/.cache/unwind, keyed by its
# inputs, so a machine that built it once goes fast. The npm servers the tests run against
# (tests/gateway/installs.py PREFETCH: server-everything, server-memory, pouchdb-server) and
# the authorization tests' Node 22, OAuth issuer and MCP conformance suite go
# to ~/.cache/unwind-tests, once. Safe to run again.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${PYTHON:-python3}"
# The binaries first, in the background: the longest part (Go compiles for about a quarter
# of an hour on a cold machine), and all it needs is Go and the standard library, so it
# starts before the virtualenv exists.
bins_out="$(mktemp)"
trap 'rm -f "$bins_out"' EXIT
PYTHONPATH="$root/operator" "$python" -m unwind.controlplane.build >"$bins_out" &
bins=$!
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
stamp=".venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  .venv/bin/pip install --quiet --upgrade pip
  .venv/bin/pip install --quiet -e '.[dev]'
  rm -f .venv/.installed-* && touch "$stamp"
fi
# The images beside the binaries: debootstrap and pip mostly wait on downloads while Go
# compiles. The Debian packages the images need come first (buildah, debootstrap).
.venv/bin/python -m unwind.controlplane.build --packages-only
.venv/bin/python -m tests.gateway.installs
.venv/bin/python -m unwind.controlplane.image
wait "$bins"
# kubectl of the control plane's version, first on the PATH README's quick start sets
ln -sfn "$(sed -n 's/^kubectl=//p' "$bins_out")" .venv/bin/kubectl
