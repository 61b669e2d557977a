"""`unwind gateway` (in a pod, or local mode) and `unwind approve|deny --ledger FILE`.

In a pod (``--cluster``, or no ``--manifests``) the gateway reads the namespace's signed
bundle and writes the run's EffectLedger through the API server, with the pod's
ServiceAccount token. Local mode is the gateway without a cluster: manifests from plain
files (unsigned, and the log says so), one ledger file per run, secrets from a folder or
the environment. Local
approvals write the decision into the ledger file; the approver's identity is whatever
``--by`` says (the entry records that identities are self-declared).
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

DEFAULT_LISTEN = "127.0.0.1:8787"


def _listen(text: str, flag: str = "--listen") -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{flag} {text}: give HOST:PORT, e.g. {DEFAULT_LISTEN}")
    return host.strip("[]") or "127.0.0.1", int(port)


def cmd_gateway(args: argparse.Namespace) -> int:
    import uvicorn

    from ..gateway.app import build_app
    from ..gateway.enforce import Gateway, Settings
    from ..gateway.metrics import Metrics
    from ..gateway.quit import ENV as QUIT_ENV
    from ..gateway.quit import enabled as quit_enabled
    from ..ledger.store import run_problem
    from ..upstream.client import Upstream
    from ..upstream.secrets import LocalSecrets

    logging.basicConfig(level=getattr(logging, args.log_level.upper()), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        host, port = _listen(args.listen)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        status = _listen(args.status_listen, "--status-listen") if args.status_listen else None
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    taken = cannot_listen(host, port)
    if not taken and status is not None:
        taken = cannot_listen(*status)
        if taken:
            print(f"error: --status-listen {args.status_listen}: cannot listen on {status[0]}:"
                  f"{status[1]}: {taken}", file=sys.stderr)
            return 1
    if taken:  # before anything is loaded: a client must not quietly reach another gateway
        print(f"error: --listen {args.listen}: cannot listen on {host}:{port}: {taken} (another "
              "gateway left running? stop it, or give --listen HOST:PORT)", file=sys.stderr)
        return 1
    run = args.run or os.environ.get("UNWIND_RUN") or None
    if run and run_problem(run):
        print(f"error: --run: {run_problem(run)}", file=sys.stderr)
        return 1
    scopes = frozenset(s.strip() for s in (args.scopes or os.environ.get("UNWIND_SCOPES", "")).split(",")
                       if s.strip())
    metrics = Metrics()
    try:
        parts = _cluster_parts(args, metrics) if args.cluster or not args.manifests \
            else _local_parts(args, metrics)
    except _SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # one line per upstream call is ours
    if not scopes and not _auth_modes(args):
        logging.getLogger("unwind.gateway").warning(
            "no --scopes: every call is refused (permission_denied); give e.g. --scopes "
            "payments:write,repo:write (or '*' for all)")
    try:
        limits = _limits(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    settings = Settings(scopes=scopes, actor=parts.actor, identities=parts.identities, **limits)
    secrets_dir = args.secrets_dir or os.environ.get("UNWIND_SECRETS_DIR") or None
    local = not (args.cluster or not args.manifests)  # only local mode starts stdio MCP servers
    gateway = Gateway(parts.catalogue, parts.store, parts.locks, Upstream(commands=local),
                      LocalSecrets(secrets_dir), settings, metrics)
    from ..gateway import tracing
    flush = tracing.configure()  # OTLP export when the OTEL_* variables ask for it
    if flush is not None:
        tracing.instrument(gateway)
        parts.closers.append(flush)
    try:
        doors = _doors(args, host, parts, gateway)
        limiter = _limiter(args, parts, metrics)
        services = _metrics_door(args, parts, metrics)
    except _SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    servers: list[uvicorn.Server] = []

    def exit_server() -> None:  # POST /quitquitquit drained the calls: exit 0
        servers[0].should_exit = True

    stop = exit_server if quit_enabled(parts.identities == "kubernetes", os.environ) else None
    if stop is None and os.environ.get(QUIT_ENV) == "1":
        logging.getLogger("unwind.gateway").warning(
            "%s is ignored in local mode: only a gateway in a pod has POST /quitquitquit", QUIT_ENV)
    app = build_app(gateway, default_run=run, host=host, closers=parts.closers, stop=stop,
                    report_in_content=True if args.report_in_content else None, doors=doors,
                    limiter=limiter, services=services)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                            lifespan="on", timeout_graceful_shutdown=5)
    servers.append(uvicorn.Server(config))
    if status is None:
        servers[0].run()
    else:
        with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:  # as Server.run
            runner.run(_serve_with_status(servers[0], gateway, status))
    return 0


async def _serve_with_status(server: Any, gateway: Any, status: tuple[str, int]) -> None:
    """The gateway's server, and beside it the probes' status port (gateway/status.py):
    ready once the server listens and the bundle is loaded."""
    from ..gateway import status as status_port

    listener = await status_port.start(*status, lambda: bool(server.started and gateway.catalogue.ready))
    try:
        await server.serve()
    finally:
        listener.close()


def cannot_listen(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on (e.g. "Address already in use"), else None."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def cmd_gateway_quit(args: argparse.Namespace) -> int:
    """Ask the pod's gateway to stop (a plain-container gateway; see gateway/quit.py). Exits
    0 whatever the answer: an agent's last step must not fail its pod."""
    from ..gateway.quit import request_quit

    print(request_quit(args.gateway or os.environ.get("UNWIND_GATEWAY") or f"http://{DEFAULT_LISTEN}"),
          file=sys.stderr)
    return 0


def _limits(args: argparse.Namespace) -> dict[str, Any]:
    """--max-runs, --runs-window and --max-entries-per-run, else their UNWIND_ variables,
    else the defaults (1000 runs per hour, 10000 entries per run); 0 turns a limit off."""
    from datetime import timedelta

    out: dict[str, Any] = {}
    for flag, env, key in (("max_runs", "UNWIND_MAX_RUNS", "max_runs"),
                           ("runs_window", "UNWIND_RUNS_WINDOW", "runs_window"),
                           ("max_entries_per_run", "UNWIND_MAX_ENTRIES_PER_RUN", "max_entries")):
        given = getattr(args, flag, None)
        text = str(given) if given is not None else os.environ.get(env)
        if text is None:
            continue
        name = "--" + flag.replace("_", "-")
        if not text.strip().isdigit():
            raise ValueError(f"{name} (or {env}) {text!r}: give a whole number, 0 or more"
                             + (" (seconds)" if key == "runs_window" else " (0: no limit)"))
        value = int(text)
        if key == "runs_window":
            if value < 1:
                raise ValueError(f"{name} (or {env}): give at least 1 second")
            out[key] = timedelta(seconds=value)
        else:
            out[key] = value or None
    return out


class _SetupError(Exception):
    """The gateway cannot start; the message says what to give it."""


@dataclass
class _Parts:
    catalogue: Any
    store: Any
    locks: Any
    actor: str
    identities: Literal["kubernetes", "self-declared"]
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    kube: Any = None  # in a pod: the API client (TokenReviews go through it)
    namespace: str = "local"


def _auth_modes(args: argparse.Namespace) -> set[str]:
    text = args.auth if args.auth is not None else os.environ.get("UNWIND_AUTH", "")
    return {m.strip() for m in text.split(",") if m.strip()}


def _doors(args: argparse.Namespace, host: str, parts: _Parts, gateway: Any) -> Any:
    """--auth kubernetes,oauth: who may call a door that is not loopback-only (gateway/auth).
    A gateway listening beyond loopback needs one, or --auth none said out loud."""
    from ..gateway.trust import LOOPBACK, host_name

    modes = _auth_modes(args)
    unknown = modes - {"kubernetes", "oauth", "none"}
    if unknown or ("none" in modes and len(modes) > 1):
        raise _SetupError(f"--auth {','.join(sorted(modes))}: give kubernetes, oauth, both "
                          "(kubernetes,oauth), or none")
    loopback = host_name(host) in LOOPBACK
    if not modes:
        if loopback:
            return None
        raise _SetupError(f"--listen {host}: a door beyond loopback must authenticate its "
                          "callers: give --auth kubernetes (ServiceAccount tokens) and/or "
                          "--auth oauth with --oauth-config (or --auth none to let anyone who "
                          "reaches it act as --actor)")
    if modes == {"none"}:
        if not loopback:
            logging.getLogger("unwind.gateway").warning(
                "--auth none on %s: anyone who reaches this port calls as %s", host,
                gateway.settings.actor)
        return None
    from ..gateway.auth.doors import Doors

    serviceaccounts = oauth = None
    if "kubernetes" in modes:
        if parts.kube is None:
            raise _SetupError("--auth kubernetes checks ServiceAccount tokens with the API "
                              "server: it needs --cluster")
        from ..gateway.auth.tokenreview import DEFAULT_AUDIENCE, ServiceAccountTokens

        audience = args.audience or os.environ.get("UNWIND_AUTH_AUDIENCE") or DEFAULT_AUDIENCE
        serviceaccounts = ServiceAccountTokens(parts.kube, parts.namespace, audience,
                                               ttl=args.token_review_ttl)
    if "oauth" in modes:
        from ..gateway.auth.oauth import OAuthConfig, OAuthConfigError, OAuthTokens

        given = args.oauth_config or os.environ.get("UNWIND_OAUTH")
        if not given:
            raise _SetupError("--auth oauth needs --oauth-config FILE (or UNWIND_OAUTH): the "
                              "issuer and the map from token scopes to Unwind permissions")
        try:
            oauth = OAuthTokens(OAuthConfig.load(given))
        except OAuthConfigError as exc:
            raise _SetupError(str(exc)) from None
    return Doors(gateway, serviceaccounts=serviceaccounts, oauth=oauth)


def _metrics_door(args: argparse.Namespace, parts: _Parts, metrics: Any) -> list[Any]:
    """--metrics-listen HOST:PORT: /metrics on a port of its own; beyond loopback its
    scrapers are authenticated by the API server (gateway/metrics_door.py)."""
    given = args.metrics_listen or os.environ.get("UNWIND_METRICS_LISTEN")
    if not given:
        return []
    from ..gateway.metrics_door import MetricsDoor, Scrapers
    from ..gateway.trust import LOOPBACK, host_name

    try:
        host, port = _listen(given)
    except ValueError as exc:
        raise _SetupError(str(exc).replace("--listen", "--metrics-listen")) from None
    if host_name(host) in LOOPBACK:
        return [MetricsDoor(metrics.registry, host, port, None)]
    if parts.kube is None:
        raise _SetupError(f"--metrics-listen {given}: metrics beyond loopback are served only "
                          "in a pod, where the API server authenticates the scrapers")
    return [MetricsDoor(metrics.registry, host, port, Scrapers(parts.kube))]


def _limiter(args: argparse.Namespace, parts: _Parts, metrics: Any) -> Any:
    """--rate-limits FILE (or UNWIND_RATE_LIMITS): the limits per actor and per tool."""
    given = args.rate_limits or os.environ.get("UNWIND_RATE_LIMITS")
    if not given:
        return None
    from ..gateway.ratelimit import Limiter, LimitsConfig, LimitsConfigError

    try:
        config = LimitsConfig.load(given)
    except LimitsConfigError as exc:
        raise _SetupError(str(exc)) from None
    return Limiter(config, parts.namespace, registry=metrics.registry)


def _local_parts(args: argparse.Namespace, metrics: Any) -> _Parts:
    """Local mode: plain manifest files (unsigned) and a folder of ledger files."""
    from ..gateway.catalogue import LocalCatalogue
    from ..ledger.filestore import FileLocks, FileStore, LedgerDirError
    from ..ledger.memory import MemoryLocks, MemoryStore

    store: Any
    locks: Any
    closers: list[Callable[[], Awaitable[None]]] = []
    if args.benchmark_memory_store:
        store, locks = MemoryStore(), MemoryLocks()
        logging.getLogger("unwind.gateway").warning("ledger in memory (benchmark only): "
                                                    "nothing is written ahead")
    else:
        if not args.ledger_dir:
            raise _SetupError("--ledger-dir is required: the folder for the run ledgers")
        try:
            store, locks = FileStore(args.ledger_dir), FileLocks(args.ledger_dir)
        except LedgerDirError as exc:
            raise _SetupError(str(exc)) from None
        metrics.ledger_fsyncs.set_function(lambda: store.fsyncs)
        closers.append(store.aclose)  # the journals folded into the pages on the way out
    # A path that is not there is a typo, not a reload to wait for (invalid manifests are:
    # the gateway serves not-ready until they are fixed)
    missing = [p for p in args.manifests if not Path(p).exists()]
    if missing:
        raise _SetupError(f"--manifests {' '.join(missing)}: no such file or folder; give the folders "
                          "or files of your ToolManifests (e.g. --manifests manifests/)")
    actor = args.actor or os.environ.get("UNWIND_ACTOR") or f"local:{getpass.getuser()}"
    rewrite = [_rewrite(r) for r in args.rewrite_upstream or []]
    return _Parts(LocalCatalogue(args.manifests, observe=args.observe, rewrite=rewrite), store, locks, actor,
                  "self-declared", closers)


def _rewrite(text: str) -> tuple[str, str]:
    from ..manifest.rewrite import parse_rewrite

    try:
        return parse_rewrite(text)
    except ValueError as exc:
        raise _SetupError(str(exc)) from exc


def _cluster_parts(args: argparse.Namespace, metrics: Any) -> _Parts:
    """Cluster mode: the namespace's signed bundle, the EffectLedger and Leases, all
    through the API server with the pod's ServiceAccount token."""
    from ..gateway.bundle_catalogue import BundleCatalogue
    from ..gateway.kube import (
        TOKEN_DIR,
        ExchangedToken,
        InClusterConfig,
        KubeClient,
        KubeConfigError,
        token_subject,
    )
    from ..ledger.clusterstore import ClusterStore, LeaseLocks

    if args.manifests or args.ledger_dir or args.benchmark_memory_store:
        raise _SetupError("--cluster reads the signed bundle and writes the EffectLedger: "
                          "drop --manifests and --ledger-dir (they are local mode)")
    try:
        config = InClusterConfig.from_env(token_file=args.token_file, ca_file=args.ca_file)
    except KubeConfigError as exc:
        raise _SetupError(str(exc)) from None
    namespace = args.namespace or os.environ.get("UNWIND_NAMESPACE")
    if not namespace:
        try:
            namespace = (TOKEN_DIR / "namespace").read_text(encoding="utf-8").strip()
        except OSError:
            raise _SetupError("no namespace: set UNWIND_NAMESPACE (the injection does) or "
                              "--namespace") from None
    operator_ns = (args.operator_namespace or os.environ.get("UNWIND_OPERATOR_NAMESPACE")
                   or "unwind-system")
    try:
        kube = KubeClient(config, timeout_s=args.api_timeout, exchange=ExchangedToken.from_env(os.environ))
        # with an exchange the pod's token is the operator's audience: the actor is UNWIND_ACTOR
        subject = token_subject(kube.token()) if kube.exchange is None else None
    except KubeConfigError as exc:
        raise _SetupError(str(exc)) from None
    actor = args.actor or os.environ.get("UNWIND_ACTOR") or subject
    if not actor:
        raise _SetupError("no actor: set UNWIND_ACTOR (the injection sets the pod's "
                          "system:serviceaccount:NS:NAME) or --actor")
    catalogue = BundleCatalogue(kube, namespace, operator_ns, metrics,
                                poll_s=args.bundle_poll_seconds)
    store = ClusterStore(kube, namespace, page_bytes=args.ledger_page_kib * 1024)
    metrics.api_bytes.set_function(lambda: kube.bytes_sent)
    metrics.ledger_api_writes.set_function(lambda: store.writes)
    logging.getLogger("unwind.gateway").info(
        "cluster mode: namespace %s, API server %s, trust from %s/unwind-trust, actor %s",
        namespace, config.server, operator_ns, actor)
    return _Parts(catalogue, store, LeaseLocks(kube, namespace), actor, "kubernetes",
                  [store.aclose, kube.aclose], kube, namespace)


def cmd_local_decide(args: argparse.Namespace) -> int:
    """Record an approve or deny decision in a local ledger file, and tally it."""
    from ..ledger.decide import add_decision, tally_entry
    from ..ledger.entry import ApprovalDecision, now, stamp
    from ..ledger.filestore import FileStore, LedgerDirError
    from ..ledger.store import EntryMissing, Stale, StoreUnavailable
    from ..ledger.ulid import new_ulid

    decision = "deny" if args.command == "deny" or args.deny else "approve"
    missing = [flag for flag, value in (("--entry", args.entry), ("--by", args.by)) if not value]
    if missing:
        print(f"error: --ledger needs {' and '.join(missing)}: which entry, and who decides",
              file=sys.stderr)
        return 1
    path = Path(args.ledger)
    try:
        run = json.loads(path.read_text(encoding="utf-8"))["spec"]["run"]
        store = FileStore(path.parent)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"error: {path}: not a ledger file ({exc})", file=sys.stderr)
        return 1
    except LedgerDirError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    made = ApprovalDecision(name=f"local-{new_ulid().lower()}", user=args.by,
                            groups=list(args.group or []), decision=decision,
                            reason=args.reason or "", created=stamp())
    try:
        entry = store.transition_sync(run, args.entry, add_decision(run, made, now()))
    except (EntryMissing, Stale, StoreUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    assert entry.approval is not None
    verb = "approved" if decision == "approve" else "denied"
    groups = f"; groups {', '.join(made.groups)}" if made.groups else ""
    print(f"{verb} entry {entry.id} ({entry.tool}) of run {run} as {made.user} (self-declared"
          f"{groups}): {entry.approval.message}")
    ignored = dict(tally_entry(run, entry, now()).ignored)
    if made.name in ignored:
        print(f"note: your decision does not count: {ignored[made.name]}", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("gateway", help="run the gateway: in a pod (--cluster) or locally "
                       "(--manifests, --ledger-dir)",
                       description="Serve POST /call/<tool> and /mcp, writing each call to the "
                       "run's ledger before any upstream call. In a pod (--cluster, or no "
                       "--manifests): the namespace's signed bundle and the EffectLedger, through "
                       "the API server. Locally: plain manifest files and <ledger-dir>/<run>.json. "
                       "See docs/gateway.md.")
    p.add_argument("--cluster", action="store_true", help="in a pod: read the signed bundle and "
                   "write EffectLedgers through the API server (the default without --manifests)")
    p.add_argument("--manifests", nargs="+", metavar="PATH",
                   help="local mode: manifest files or folders (validated as a set, unsigned)")
    p.add_argument("--ledger-dir", metavar="DIR", help="local mode: folder for the run ledgers "
                   "(created if missing; must be writable)")
    p.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                   help=f"where to listen (default {DEFAULT_LISTEN})")
    p.add_argument("--status-listen", metavar="HOST:PORT", help="also listen here for the "
                   "kubelet's probes: GET /healthz and /readyz only, nothing else (the injection "
                   "gives 0.0.0.0:8788; default: none)")
    p.add_argument("--rewrite-upstream", action="append", metavar="FROM=TO",
                   help="local mode: call TO instead of an upstream URL that starts with FROM (repeatable), "
                   "e.g. http://10.0.0.88:8788=http://127.0.0.1:8788 runs the cluster's examples against "
                   "the test upstream on this machine")
    p.add_argument("--observe", action="store_true", help="local mode: record permission, requires, "
                   "schema-drift and approval violations in the entry instead of refusing (a rollout; in "
                   "a pod the namespace's unwind.dev/mode annotation decides)")
    p.add_argument("--scopes", metavar="P1,P2", help="permissions calls may use, comma-separated "
                   "('*' for all; default UNWIND_SCOPES, else none)")
    p.add_argument("--actor", metavar="NAME", help="who the calls are made as (default "
                   "UNWIND_ACTOR, else the token's ServiceAccount in a pod, local:<user> locally)")
    p.add_argument("--run", metavar="NAME", help="the run when a request sends no X-Unwind-Run "
                   "(default UNWIND_RUN)")
    p.add_argument("--report-in-content", action="store_true", help="MCP answers carry the "
                   "effect report as a last text block too, for clients that drop _meta (default "
                   "UNWIND_REPORT_IN_CONTENT; a request's X-Unwind-Report: content|meta decides "
                   "for itself)")
    p.add_argument("--secrets-dir", metavar="DIR", help="secrets as DIR/<name>/<key> files "
                   "(default UNWIND_SECRETS_DIR; the environment's UNWIND_SECRET_<NAME>_<KEY> is "
                   "read too)")
    p.add_argument("--namespace", metavar="NS", help="in a pod: the pod's namespace (default "
                   "UNWIND_NAMESPACE, else the ServiceAccount's namespace file)")
    p.add_argument("--operator-namespace", metavar="NS", help="in a pod: where ConfigMap "
                   "unwind-trust lives (default UNWIND_OPERATOR_NAMESPACE, else unwind-system)")
    p.add_argument("--token-file", metavar="FILE", help="in a pod: the ServiceAccount token, read "
                   "again when it changes (default UNWIND_TOKEN_FILE, else "
                   "/var/run/secrets/kubernetes.io/serviceaccount/token)")
    p.add_argument("--ca-file", metavar="FILE", help="in a pod: the API server's CA (default "
                   "UNWIND_CA_FILE, else ca.crt beside the token)")
    p.add_argument("--bundle-poll-seconds", type=float, default=2.0, metavar="S",
                   help="in a pod: how often the bundle's root is checked for a change (default 2)")
    p.add_argument("--ledger-page-kib", type=int, default=16, metavar="KIB",
                   help="in a pod: a run continues in a new EffectLedger page past this size "
                   "(default 16: every write rewrites the page)")
    p.add_argument("--api-timeout", type=float, default=5.0, metavar="S",
                   help="in a pod: the longest an API request may take; past it the call gets "
                   "503 (default 5)")
    p.add_argument("--max-runs", metavar="N", help="the most distinct runs (X-Unwind-Run) this "
                   "gateway writes per --runs-window; past it a call into a new run gets 429 "
                   "rate_limited (default UNWIND_MAX_RUNS, else 1000; 0: no limit)")
    p.add_argument("--runs-window", metavar="S", help="the window of --max-runs, in seconds "
                   "(default UNWIND_RUNS_WINDOW, else 3600)")
    p.add_argument("--max-entries-per-run", metavar="N", help="the most entries one run's "
                   "ledger takes; past it a call gets 429 rate_limited (default "
                   "UNWIND_MAX_ENTRIES_PER_RUN, else 10000; 0: no limit)")
    p.add_argument("--auth", metavar="MODES", help="who may call: kubernetes (ServiceAccount "
                   "tokens, by TokenReview; in a pod), oauth (JWT access tokens of --oauth-config's "
                   "issuer), both (kubernetes,oauth), or none; required when --listen is not "
                   "loopback (default UNWIND_AUTH, else none on loopback)")
    p.add_argument("--audience", metavar="AUD", help="the audience a ServiceAccount token must "
                   "name (default UNWIND_AUTH_AUDIENCE, else unwind-gateway)")
    p.add_argument("--token-review-ttl", type=float, default=10.0, metavar="S",
                   help="how long one TokenReview answer is kept per token (default 10)")
    p.add_argument("--oauth-config", metavar="FILE", help="the OAuth issuer and the map from "
                   "token scopes to Unwind permissions, JSON or YAML (default UNWIND_OAUTH, a "
                   "file name or the JSON itself); see docs/gateway.md")
    p.add_argument("--metrics-listen", metavar="HOST:PORT", help="also serve /metrics on this "
                   "port; beyond loopback, for scrapers whose token the API server accepts and "
                   "who may get /metrics (default UNWIND_METRICS_LISTEN; none)")
    p.add_argument("--rate-limits", metavar="FILE", help="rate limits per actor and per tool, "
                   "JSON or YAML (default UNWIND_RATE_LIMITS); see docs/gateway.md")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.add_argument("--benchmark-memory-store", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_gateway)

    p = sub.add_parser("gateway-quit", help="stop the pod's gateway once its calls in flight are "
                       "done (an agent's last step where the gateway is a plain container)",
                       description="POST /quitquitquit to the gateway, so a pod whose agent ended "
                       "completes; a gateway without the endpoint (a native sidecar) is no error. "
                       "Always exits 0. See docs/gateway.md.")
    p.add_argument("--gateway", metavar="URL", help="the gateway (default UNWIND_GATEWAY, else "
                   f"http://{DEFAULT_LISTEN})")
    p.set_defaults(func=cmd_gateway_quit)
