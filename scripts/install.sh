#!/usr/bin/env bash
# Install everything Unwind's tests and `unwind dev up` need, on a fresh Debian machine with
# Go 1.26 or newer: a virtualenv with the project and its dev tools; the Debian packages
# (containerd, runc, CNI plugins, iptables, buildah, debootstrap, skopeo); the control plane's
# and the node's binaries (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kubectl; kubelet, kube-proxy) built from Go modules; and the project's image and a pause
# image built with buildah. Everything built is cached in ~/.cache/unwind, keyed by its
# inputs, so a machine that built it once goes fast. The npm MCP servers the tests run
# against (tests/gateway/installs.py PREFETCH) go to ~/.cache/unwind-tests, once. Safe to
# run again.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${PYTHON:-python3}"
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
# compiles. The Debian packages both need come first (buildah and debootstrap included).
.venv/bin/python -m unwind.controlplane.build --packages-only
.venv/bin/python -m tests.gateway.installs
.venv/bin/python -m unwind.controlplane.image &
images=$!
bins="$(.venv/bin/python -m unwind.controlplane.build)"
wait "$images"
# kubectl of the control plane's version, first on the PATH README's quick start sets
ln -sfn "$(sed -n 's/^kubectl=//p' <<<"$bins")" .venv/bin/kubectl
