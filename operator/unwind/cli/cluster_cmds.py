"""`unwind operator` and `unwind dev up|down`."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path


def _env_list(name: str, default: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in os.environ.get(name, default).split(",") if v.strip())


def cmd_operator(args: argparse.Namespace) -> int:
    from ..operator.handlers import Config, run

    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    namespace = args.operator_namespace or os.environ.get("UNWIND_OPERATOR_NAMESPACE")
    if not namespace:
        print("error: --operator-namespace (or UNWIND_OPERATOR_NAMESPACE) is required: the "
              "namespace holding the signing key Secret", file=sys.stderr)
        return 1
    try:
        window = float(args.bundle_window if args.bundle_window is not None
                       else os.environ.get("UNWIND_BUNDLE_WINDOW_SECONDS", "1.0"))
    except ValueError:
        print("error: the bundle window must be a number of seconds", file=sys.stderr)
        return 1
    appliers = (tuple(a.strip() for a in args.trusted_appliers.split(",") if a.strip())
                if args.trusted_appliers is not None else _env_list("UNWIND_TRUSTED_APPLIERS", "*"))
    config = Config(operator_namespace=namespace, namespaces=tuple(args.namespace or ()),
                    trusted_appliers=appliers, bundle_window=window)
    run(config, args.liveness, args.metrics_port)
    return 0


CHART_DONE = {"install": "installed", "reinstall": "reinstalled (an unfinished install was removed)",
              "upgrade": "upgraded", "recover": "rolled back from an unfinished change, then upgraded"}


def cmd_dev_up(args: argparse.Namespace) -> int:
    from ..controlplane.cluster import ControlPlaneError
    from ..controlplane.dev import up

    workdir = Path(args.dir).resolve()
    try:
        started = up(workdir, clean=args.clean)
    except ControlPlaneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    cp, start = started.control_plane, started.start
    if start.resume:
        print(f"resumed the stopped cluster in {cp.workdir}: {start.why}")
    else:
        print(f"started a clean cluster in {cp.workdir}: {start.why}")
    print(f"chart: release unwind {CHART_DONE[started.chart]}")
    print(f"control plane: {cp.server}")
    print(f"operator: pid {started.operator_pid}, log {workdir / 'operator.log'}")
    print(f"export KUBECONFIG={cp.kubeconfig}")
    return 0


def cmd_dev_down(args: argparse.Namespace) -> int:
    from ..controlplane.dev import down

    if down(Path(args.dir).resolve()):
        print(f"stopped; its data stays in {args.dir} (`unwind dev up` resumes it, "
              "`unwind dev up --clean` starts over)")
    else:
        print(f"nothing was running in {args.dir}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("operator", help="run the operator (kopf)")
    p.add_argument("--namespace", action="append", help="watch this namespace (repeatable; default all)")
    p.add_argument("--operator-namespace", help="namespace of the signing key and trust ConfigMap "
                   "(default $UNWIND_OPERATOR_NAMESPACE)")
    p.add_argument("--trusted-appliers", help="comma-separated identities whose lifecycle: approved "
                   "is honoured; * for all (default $UNWIND_TRUSTED_APPLIERS or *)")
    p.add_argument("--bundle-window", type=float, help="seconds to coalesce changes before a bundle "
                   "rebuild (default $UNWIND_BUNDLE_WINDOW_SECONDS or 1.0)")
    p.add_argument("--liveness", help="kopf liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    p.add_argument("--kubeconfig", help="kubeconfig file (default in-cluster, then $KUBECONFIG)")
    p.add_argument("--log-level", default=os.environ.get("UNWIND_LOG_LEVEL", "info"))
    p.set_defaults(func=cmd_operator)

    dev = sub.add_parser("dev", help="the local control plane with Unwind installed")
    dsub = dev.add_subparsers(dest="dev_command", required=True, metavar="COMMAND")
    p = dsub.add_parser("up", help="start etcd, kube-apiserver, the controller manager and the operator")
    p.add_argument("--dir", default=".dev", help="working folder (default .dev)")
    p.add_argument("--clean", action="store_true", help="delete a stopped cluster's data in --dir "
                   "and start over (default: resume it)")
    p.set_defaults(func=cmd_dev_up)
    p = dsub.add_parser("down", help="stop what `dev up` started")
    p.add_argument("--dir", default=".dev")
    p.set_defaults(func=cmd_dev_down)
