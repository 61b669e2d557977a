#!/usr/bin/env bash
# Thin wrapper around unwind.controlplane for CI and people.
#   bash scripts/controlplane.sh build          install Debian packages if missing, build and cache the
#                                               control plane's and the node's binaries (minutes, once)
#   bash scripts/controlplane.sh up DIR         start a control plane in DIR (kubeconfig: DIR/kubeconfig)
#   bash scripts/controlplane.sh down DIR       stop the control plane started in DIR
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-$root/.venv/bin/python}"
[ -x "$py" ] || py="$(command -v python3)"
export PYTHONPATH="$root/operator${PYTHONPATH:+:$PYTHONPATH}"

case "${1:-}" in
  build)
    exec "$py" -m unwind.controlplane.build ;;
  up)
    dir="${2:?usage: $0 up DIR}"
    exec "$py" -c 'import sys; from unwind.controlplane import ControlPlane
cp = ControlPlane().start(sys.argv[1]); print(f"server={cp.server}\nkubeconfig={cp.kubeconfig}")' "$dir" ;;
  down)
    dir="${2:?usage: $0 down DIR}"
    exec "$py" -c 'import sys; from unwind.controlplane import stop_from_dir
print("stopped" if stop_from_dir(sys.argv[1]) else "nothing running")' "$dir" ;;
  *)
    sed -n '2,7p' "$0"; exit 2 ;;
esac
