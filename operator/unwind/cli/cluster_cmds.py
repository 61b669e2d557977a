"""`unwind operator` and `unwind dev up|down`."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Any


def _env_list(name: str, default: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in os.environ.get(name, default).split(",") if v.strip())


def _flag_or_env(value: str | None, env: str, default: str) -> str:
    return value if value is not None else os.environ.get(env, default)


def cmd_operator(args: argparse.Namespace) -> int:
    from ..operator.certs import Lifetimes
    from ..operator.handlers import Config, run
    from ..operator.hooks import WebhookConfig, parse_lifetime
    from ..operator.leader import Timing

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
                if args.trusted_appliers is not None else _env_list("UNWIND_TRUSTED_APPLIERS", ""))
    four_eyes = _flag_or_env(args.four_eyes, "UNWIND_FOUR_EYES", "true").lower()
    if four_eyes not in ("true", "false"):
        print("error: --four-eyes must be true or false", file=sys.stderr)
        return 1
    try:
        lifetimes = Lifetimes(parse_lifetime(args.webhook_cert_lifetime), parse_lifetime(args.webhook_ca_lifetime))
        lease = float(args.lease_duration)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    names = tuple(args.webhook_name or ())
    if args.webhook_service:
        names += WebhookConfig.service_names(args.webhook_service, namespace)
    webhook = WebhookConfig(addr=args.webhook_addr, port=args.webhook_port, names=names or ("127.0.0.1",),
                            configurations=tuple(args.webhook_configuration or ("unwind",)),
                            lifetimes=lifetimes, service=args.webhook_service or "",
                            exchange_port=args.exchange_port, exchange_url=args.exchange_url,
                            role_prefix=args.role_prefix)
    config = Config(operator_namespace=namespace, namespaces=tuple(args.namespace or ()),
                    trusted_appliers=appliers, four_eyes=four_eyes == "true", bundle_window=window,
                    webhook=webhook, lease=Timing(lease, lease * 2 / 3, max(0.5, lease / 7.5)),
                    key_check_seconds=args.key_check_seconds, gateway_image=args.gateway_image,
                    rollback_parallelism=args.rollback_parallelism, lookup_seconds=args.lookup_interval,
                    retention_dry_run=args.retention_dry_run, sidecar_mode=args.sidecar_mode)
    try:
        config.shared_gateway = _shared_gateway(args, namespace)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    run(config, args.liveness, args.metrics_port)
    return 0


def _shared_gateway(args: argparse.Namespace, namespace: str) -> Any:
    """--shared-gateways FILE (the chart's sharedGateway values as JSON): namespaces annotated
    unwind.dev/shared-gateway=true get one (operator/shared_gateway.py)."""
    given = args.shared_gateways or os.environ.get("UNWIND_SHARED_GATEWAYS")
    if not given:
        return None
    import json
    from pathlib import Path

    from ..operator.shared_gateway import SharedSettings

    text = given if given.strip().startswith("{") else Path(given).read_text(encoding="utf-8")
    data = json.loads(text)
    image = data.get("image") or args.gateway_image
    if not image:
        raise ValueError("--shared-gateways needs the gateway's image: give --gateway-image")
    if data.get("rateLimits"):
        from ..gateway.ratelimit import LimitsConfig
        LimitsConfig.parse(data["rateLimits"], "sharedGateway.rateLimits")
    if data.get("oauth"):
        from ..gateway.auth.oauth import OAuthConfig
        OAuthConfig.parse(data["oauth"], "sharedGateway.oauth")
    return SharedSettings(image=image, operator_namespace=namespace,
                          role_prefix=data.get("rolePrefix", "unwind"),
                          replicas=int(data.get("replicas", 2)),
                          pull_policy=data.get("pullPolicy", "IfNotPresent"),
                          audience=data.get("audience", "unwind-gateway"),
                          rate_limits=data.get("rateLimits") or None,
                          oauth=data.get("oauth") or None,
                          otel_endpoint=data.get("otelEndpoint", ""))


CHART_DONE = {"install": "installed", "reinstall": "reinstalled (an unfinished install was removed)",
              "upgrade": "upgraded", "recover": "rolled back from an unfinished change, then upgraded"}


def cmd_rotate_key(args: argparse.Namespace) -> int:
    from kubernetes import client, config

    from ..operator.keys import SECRET_NAME, rotate_signing_key

    namespace = args.operator_namespace or os.environ.get("UNWIND_OPERATOR_NAMESPACE") or "unwind-system"
    api = config.new_client_from_config(config_file=args.kubeconfig)  # type: ignore[no-untyped-call]
    try:
        old, new = rotate_signing_key(client.CoreV1Api(api), namespace)
    except client.ApiException as exc:
        print(f"error: cannot rotate Secret {namespace}/{SECRET_NAME}: {exc.status} {exc.reason}", file=sys.stderr)
        return 1
    print(f"signing key {old} retired, {new} is current: the operator re-signs every bundle within "
          f"seconds and drops {old} from ConfigMap {namespace}/unwind-trust once no bundle uses it")
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    """A probe for containers whose server listens on loopback only (the gateway sidecar):
    the kubelet's httpGet would dial the pod IP."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(args.url, timeout=args.timeout) as answer:
            return 0 if 200 <= answer.status < 300 else 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"{args.url}: {exc}", file=sys.stderr)
        return 1


def cmd_dev_up(args: argparse.Namespace) -> int:
    from ..controlplane.cluster import ControlPlaneError
    from ..controlplane.dev import (
        DEV_IMAGE,
        OPERATOR_DEPLOYMENT,
        OPERATOR_NAMESPACE,
        UPSTREAM_HOSTS,
        UPSTREAM_PORT,
        up,
    )
    from ..controlplane.kubenode import NODE_NAME

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
    print(f"control plane: {cp.server}; node {NODE_NAME} (kubelet, containerd), logs in {cp.workdir / 'logs'}")
    print(f"chart: release unwind {CHART_DONE[started.chart]}; the operator runs as "
          f"deployment/{OPERATOR_DEPLOYMENT} in {OPERATOR_NAMESPACE} (image {DEV_IMAGE})")
    if started.upstream:
        print(f"examples' upstream (a fake GitHub and Stripe): http://{UPSTREAM_HOSTS[0]}:{UPSTREAM_PORT} "
              f"and http://127.0.0.1:{UPSTREAM_PORT}, for pods Service upstream.unwind-examples "
              f"(10.0.0.88:{UPSTREAM_PORT}); log {workdir / 'upstream.log'}")
    else:
        print(f"examples' upstream: not started (port {UPSTREAM_PORT} is taken, or tests/upstream is not here)")
    print(f"export KUBECONFIG={cp.kubeconfig}")
    return 0


def cmd_dev_node(args: argparse.Namespace) -> int:
    import signal
    import threading

    from kubernetes import client, config

    from ..controlplane.node import Node

    config.load_kube_config(args.kubeconfig)  # type: ignore[no-untyped-call]
    env = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    with Node(client.ApiClient(), namespace=args.namespace, workers=args.workers,
              logs=Path(args.logs) if args.logs else None, extra_env=env):
        print(f"node: running undo Jobs' pods and pods with the gateway sidecar in "
              f"{args.namespace or 'every namespace'}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            done.wait()
    return 0


def cmd_dev_image(args: argparse.Namespace) -> int:
    from ..controlplane.image import ImageError, ensure_images
    from ..controlplane.imageimport import import_images

    try:
        images = ensure_images()
        for img in (images.base, images.unwind, images.pause):
            print(f"{img.name}: {img.ref} ({'built now' if img.name in images.built else 'cached'}), {img.tar}")
        if args.import_to:
            import_images(args.import_to, images)
            print(f"imported into {args.import_to}")
    except ImageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_dev_restart_operator(args: argparse.Namespace) -> int:
    from ..controlplane.cluster import ControlPlaneError
    from ..controlplane.dev import (
        DEV_IMAGE,
        OPERATOR_DEPLOYMENT,
        OPERATOR_NAMESPACE,
        restart_operator,
    )
    from ..controlplane.image import ImageError

    try:
        imported = restart_operator(Path(args.dir).resolve())
    except (ControlPlaneError, ImageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    image = (f"image {DEV_IMAGE} built again and imported" if imported
             else f"image {DEV_IMAGE} unchanged")
    print(f"restarted deployment/{OPERATOR_DEPLOYMENT} in {OPERATOR_NAMESPACE} ({image}); its pods "
          "are Ready; the control plane, the node and what you applied were left as they were")
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
    p.add_argument("--trusted-appliers", help="comma-separated usernames (service accounts as "
                   "system:serviceaccount:NS:NAME) whose lifecycle: approved is honoured without an "
                   "Approval (default $UNWIND_TRUSTED_APPLIERS, else none)")
    p.add_argument("--four-eyes", choices=("true", "false"), help="an approver may not be who last "
                   "changed the spec (default $UNWIND_FOUR_EYES or true)")
    # a string default: argparse converts it only for `unwind operator`, and a bad value
    # (a Service named unwind-webhook gives pods UNWIND_WEBHOOK_PORT=tcp://...) is its error
    p.add_argument("--webhook-port", type=int, default=os.environ.get("UNWIND_WEBHOOK_PORT", "9443"),
                   help="HTTPS port of the admission webhooks (default $UNWIND_WEBHOOK_PORT or 9443)")
    p.add_argument("--webhook-addr", default=os.environ.get("UNWIND_WEBHOOK_ADDR", "0.0.0.0"),
                   help="address the webhooks listen on (default 0.0.0.0)")
    p.add_argument("--webhook-service", help="the webhooks' Service: its DNS names go into the "
                   "serving certificate")
    p.add_argument("--webhook-name", action="append", help="another DNS name or IP for the serving "
                   "certificate (repeatable; 127.0.0.1 when none is given)")
    p.add_argument("--exchange-port", type=int, default=os.environ.get("UNWIND_EXCHANGE_PORT", "9444"),
                   help="HTTPS port where injected gateways trade their pod's token for one of ServiceAccount "
                   "unwind-gateway (default $UNWIND_EXCHANGE_PORT or 9444; 0: none, and gateways act as "
                   "their pod's ServiceAccount, which then needs the gateway role). docs/security.md")
    p.add_argument("--exchange-url", default=os.environ.get("UNWIND_EXCHANGE_URL", ""),
                   help="where gateways reach the exchange (default: the --webhook-service's cluster IP, "
                   "port exchange; without a Service, the webhooks' address)")
    p.add_argument("--role-prefix", default=os.environ.get("UNWIND_ROLE_PREFIX", "unwind"),
                   help="the chart's fullname: each namespace's unwind-gateway is bound to ClusterRole "
                   "PREFIX-gateway (default $UNWIND_ROLE_PREFIX or unwind)")
    p.add_argument("--webhook-configuration", action="append", help="Validating/Mutating webhook "
                   "configuration whose caBundle the operator keeps current (repeatable; default unwind)")
    p.add_argument("--webhook-cert-lifetime", default="90d", help="serving certificate lifetime; "
                   "renewed with a third left (default 90d)")
    p.add_argument("--webhook-ca-lifetime", default="3650d", help="webhook CA lifetime (default 3650d)")
    p.add_argument("--gateway-image", default=os.environ.get("UNWIND_GATEWAY_IMAGE", ""),
                   help="image of the gateway sidecar injected into pods labelled "
                   "unwind.dev/inject=true (default $UNWIND_GATEWAY_IMAGE; empty: no injection)")
    p.add_argument("--sidecar-mode", choices=("auto", "native", "container"),
                   default=os.environ.get("UNWIND_SIDECAR_MODE", "auto"),
                   help="how the gateway is injected: native (an init container with restartPolicy: "
                   "Always; Kubernetes 1.29+), container (a plain container the agent stops with "
                   "POST /quitquitquit), auto (native when the API server is 1.29 or newer; default "
                   "$UNWIND_SIDECAR_MODE or auto). docs/compatibility.md")
    p.add_argument("--shared-gateways", metavar="FILE", help="namespaces annotated "
                   "unwind.dev/shared-gateway=true get a shared gateway Deployment and Service: "
                   "its settings as JSON (replicas, rateLimits, oauth, otelEndpoint, rolePrefix; "
                   "the chart's sharedGateway values), a file or the JSON itself (default "
                   "$UNWIND_SHARED_GATEWAYS; none: no shared gateways)")
    p.add_argument("--rollback-parallelism", type=int, default=4, help="undo Jobs of one ledger "
                   "running at once, when their steps are independent (default 4)")
    p.add_argument("--lookup-interval", type=float, default=60.0, help="seconds between lookups of "
                   "a lost answer (doubling per failed attempt) and between retention passes (default 60)")
    p.add_argument("--retention-dry-run", action="store_true", help="mark ledgers past their "
                   "retention (condition RetentionExpired, Event RetentionDue), never delete them")
    p.add_argument("--key-check-seconds", type=float, default=10.0, help="how often the signing key "
                   "Secret and ConfigMap unwind-trust are checked (default 10)")
    p.add_argument("--lease-duration", default=os.environ.get("UNWIND_LEASE_SECONDS", "15"),
                   help="leader election: seconds before another replica takes over (default 15)")
    p.add_argument("--bundle-window", type=float, help="seconds to coalesce changes before a bundle "
                   "rebuild (default $UNWIND_BUNDLE_WINDOW_SECONDS or 1.0)")
    p.add_argument("--liveness", help="kopf liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    p.add_argument("--kubeconfig", help="kubeconfig file (default in-cluster, then $KUBECONFIG)")
    p.add_argument("--log-level", default=os.environ.get("UNWIND_LOG_LEVEL", "info"))
    p.set_defaults(func=cmd_operator)

    p = sub.add_parser("rotate-signing-key", help="replace the operator's signing key; the old one "
                       "stays trusted until every bundle is re-signed")
    p.add_argument("--operator-namespace", help="namespace of Secret unwind-signing-key (default "
                   "$UNWIND_OPERATOR_NAMESPACE or unwind-system)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default $KUBECONFIG)")
    p.set_defaults(func=cmd_rotate_key)

    p = sub.add_parser("probe", help="exit 0 when URL answers 2xx (a container probe)")
    p.add_argument("url")
    p.add_argument("--timeout", type=float, default=3.0)
    p.set_defaults(func=cmd_probe)

    dev = sub.add_parser("dev", help="the local control plane with Unwind installed")
    dsub = dev.add_subparsers(dest="dev_command", required=True, metavar="COMMAND")
    p = dsub.add_parser("up", help="start the control plane and its node, install the chart (the "
                        "operator as a Deployment of the project's image) and the examples' upstream")
    p.add_argument("--dir", default=".dev", help="working folder (default .dev)")
    p.add_argument("--clean", action="store_true", help="delete a stopped cluster's data in --dir "
                   "and start over (default: resume it)")
    p.set_defaults(func=cmd_dev_up)
    p = dsub.add_parser("image", help="build the project's image and the pause image with buildah "
                        "(cached by a digest of their inputs); --import SOCKET loads them into a containerd")
    p.add_argument("--import", dest="import_to", metavar="SOCKET", help="containerd socket to import into")
    p.set_defaults(func=cmd_dev_image)
    p = dsub.add_parser("node", help="the kubelet stand-in, for a few fast tests (dev up runs a real "
                        "kubelet): run undo Jobs' pods and pods with the gateway sidecar as local processes")
    p.add_argument("--kubeconfig", default=None, help="default $KUBECONFIG")
    p.add_argument("-n", "--namespace", default=None, help="only this namespace (default: all)")
    p.add_argument("--workers", type=int, default=4, help="pods run at once (default 4)")
    p.add_argument("--logs", default=None, help="keep each container's output in LOGS/NAMESPACE/POD/")
    p.set_defaults(func=cmd_dev_node)
    p = dsub.add_parser("restart-operator", help="only the operator: rebuild the image if its "
                        "inputs changed, import it into the node and restart the Deployment",
                        description="Restart only the operator of the running dev cluster: the "
                        "project's image is built again when the code or the Dockerfile changed "
                        "(cached otherwise) and imported into the node's containerd, then "
                        "deployment/unwind-operator is restarted and waited for. Nothing else stops.")
    p.add_argument("--dir", default=".dev", help="working folder of `dev up` (default .dev)")
    p.set_defaults(func=cmd_dev_restart_operator)
    p = dsub.add_parser("down", help="stop what `dev up` started")
    p.add_argument("--dir", default=".dev")
    p.set_defaults(func=cmd_dev_down)
