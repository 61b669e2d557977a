"""The REST door: ``POST /call/<tool>``, ``GET /calls/<run>/<entry>`` and the probes.

Everything a request says is checked here before enforcement sees it, each with a
message naming the header or field: the run (``X-Unwind-Run``, else the gateway's
default), the Idempotency-Key, the body (at most 64 KiB of JSON: ``arguments``, ``stage``,
``dry_run``). Requests that name no valid run are answered and not recorded (there is no
ledger to put them in); every other refusal is recorded by the enforcement path.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..ledger.store import ENTRY_ID_PATTERN, run_problem
from ..ledger.ulid import new_ulid
from ..upstream.errors import Refusal
from ..upstream.limits import MAX_BODY, OverLimit, check_arguments, too_deep
from .enforce import CallRequest, CallResult, Gateway
from .schemas import BadArguments, check_call_arguments
from .stages.admission import Admission, annotate

if TYPE_CHECKING:
    from .ratelimit import Limiter

log = logging.getLogger("unwind.gateway")
REPORT_HEADER = "X-Unwind-Effect"
_BODY_FIELDS = {"arguments", "stage", "dry_run"}


def report_header(report: dict[str, Any]) -> str:
    """The report as one header value: compact JSON with every non-ASCII character escaped."""
    return json.dumps(report, ensure_ascii=True, separators=(",", ":"))


def error_response(refusal: Refusal) -> JSONResponse:
    return JSONResponse(refusal.envelope(), status_code=refusal.status)


def respond(result: CallResult) -> Response:
    headers = {REPORT_HEADER: report_header(result.report)} if result.report else {}
    return JSONResponse(result.body, status_code=result.status, headers=headers)


def choose_run(header: str | None, default: str | None) -> str:
    """The run of a request (REST and MCP alike), or a refusal naming the header."""
    run = header if header is not None else default
    if not run:
        raise Refusal("validation_error", "no run: send the X-Unwind-Run header (or start the "
                      "gateway with --run / UNWIND_RUN)")
    problem = run_problem(run)
    if problem:
        raise Refusal("validation_error", f"X-Unwind-Run: {problem}")
    return run


def check_entry_id(value: str | None) -> str:
    if value is None:
        return new_ulid()
    if not ENTRY_ID_PATTERN.fullmatch(value):
        raise Refusal("validation_error", "Idempotency-Key must be 1 to 128 letters, digits and "
                      "'.', '_', ':' or '-' (it becomes the ledger entry id)")
    return value


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_body(raw: bytes) -> tuple[dict[str, Any], bool, bool]:
    """(arguments, stage, dry_run) from a call's body, or a refusal naming the field."""
    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=_no_constants) if raw.strip() else {}
    except (UnicodeDecodeError, ValueError) as exc:
        raise Refusal("validation_error", f"the body is not JSON: {exc}") from None
    except RecursionError:
        raise too_deep() from None
    if not isinstance(body, dict):
        raise Refusal("validation_error", 'the body must be a JSON object: {"arguments": {...}}')
    unknown = sorted(set(body) - _BODY_FIELDS)
    if unknown:
        raise Refusal("validation_error", f"unknown field {', '.join(map(repr, unknown))} in the "
                      "body: it takes arguments, stage and dry_run")
    arguments = body.get("arguments", {})
    if not isinstance(arguments, dict):
        raise Refusal("validation_error", "arguments must be a JSON object")
    flags = []
    for name in ("stage", "dry_run"):
        value = body.get(name, False)
        if not isinstance(value, bool):
            raise Refusal("validation_error", f"{name} must be true or false")
        flags.append(value)
    return arguments, flags[0], flags[1]


async def read_limited(request: Request, limit: int = MAX_BODY) -> bytes | None:
    """The body, or None once it passes ``limit`` bytes (counted, not trusted from a header)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def acting(request: Request, gateway: Gateway) -> Gateway:
    """The gateway acting as the request's authenticated caller (gateway/auth), else the
    gateway itself (a loopback-only door: its --actor and --scopes)."""
    view = request.scope.get("unwind.gateway")
    return view if view is not None else gateway


def routes(gateway: Gateway, default_run: str | None, limiter: Limiter | None = None
           ) -> list[Route]:
    admission = Admission(limiter)

    async def call(request: Request) -> Response:
        gw = acting(request, gateway)
        tool = request.path_params["tool"]
        decision = await admission.limit(gw, tool)
        if decision is not None and decision.refusal is not None:
            result = await _limited(request, gw, decision.refusal)
        else:
            result = await _call(request, gw)
        response = _answer(request, result)
        annotate(gw, tool, request.headers.get("x-unwind-run") or default_run or "", result)
        for name, value in decision.headers() if decision is not None else ():
            response.headers[name] = value
        return response

    async def _limited(request: Request, gw: Gateway, refusal: Refusal) -> CallResult:
        """A call over its limit: recorded as refused (when it names a run), never run."""
        try:
            run = choose_run(request.headers.get("x-unwind-run"), default_run)
        except Refusal as bad:
            return CallResult(bad.status, bad.envelope())
        given = request.headers.get("idempotency-key")
        entry_id = given if given is not None and ENTRY_ID_PATTERN.fullmatch(given) else new_ulid()
        return await admission.refuse(gw, request.path_params["tool"], run, entry_id, refusal)

    def _answer(request: Request, result: CallResult) -> Response:
        doors = request.scope.get("unwind.doors")
        if doors is not None and result.status == 403 and isinstance(result.body, dict) \
                and result.body.get("error", {}).get("code") == "permission_denied":
            served = gateway.catalogue.get(request.path_params["tool"])
            challenge = doors.insufficient_scope(request.scope, served.manifest.permission) \
                if served is not None else None
            if challenge:
                response = respond(result)
                response.headers["WWW-Authenticate"] = challenge
                return response
        return respond(result)

    async def _call(request: Request, gateway: Gateway) -> CallResult:
        tool = request.path_params["tool"]
        try:
            run = choose_run(request.headers.get("x-unwind-run"), default_run)
        except Refusal as refusal:
            return CallResult(refusal.status, refusal.envelope())
        given = request.headers.get("idempotency-key")
        entry_id = given if given is not None and ENTRY_ID_PATTERN.fullmatch(given) else new_ulid()
        try:
            if given is not None:  # (checked without one, it would draw a ULID to drop)
                check_entry_id(given)
            raw = await read_limited(request)
            if raw is None:
                raise Refusal("payload_too_large", f"the body is larger than {MAX_BODY // 1024} "
                              "KiB: send less (arguments are for calls, not for documents)")
            arguments, stage, dry_run = parse_body(raw)
            check_arguments(arguments)
            served = gateway.catalogue.get(tool)
            await check_call_arguments(served.manifest if served else None, arguments,
                                 gateway.upstream)
        except BadArguments as refusal:  # refused at the door, not recorded: no values logged
            log.info("call run=%s entry=%s tool=%s status=%d outcome=%s fields=%s (not "
                     "recorded)", run, entry_id, tool[:128], refusal.status, refusal.code,
                     refusal.where)
            return CallResult(refusal.status, refusal.envelope())
        except OverLimit as refusal:  # refused at the door: nothing of it reaches the ledger
            log.info("call run=%s entry=%s tool=%s status=%d outcome=%s message=%r (not "
                     "recorded)", run, entry_id, tool[:128], refusal.status, refusal.code,
                     refusal.message)
            return CallResult(refusal.status, refusal.envelope())
        except Refusal as refusal:
            req = CallRequest(tool=tool, arguments={}, run=run, entry_id=entry_id)
            return await gateway.reject(req, refusal)
        req = CallRequest(tool=tool, arguments=arguments, run=run, entry_id=entry_id,
                          stage=stage, dry_run=dry_run)
        return await gateway.call(req)

    async def get_entry(request: Request) -> Response:
        run, entry_id = request.path_params["run"], request.path_params["entry"]
        problem = run_problem(run)
        if problem:
            return error_response(Refusal("validation_error", problem))
        try:
            entry = await acting(request, gateway).read_entry(run, entry_id)  # this actor's
        except Refusal as refusal:
            return error_response(refusal)
        if entry is None:
            return error_response(Refusal("not_found", f"no entry {entry_id} in run {run}"))
        return JSONResponse(entry.to_json())

    async def healthz(_: Request) -> Response:
        return JSONResponse({"ok": True})

    async def readyz(_: Request) -> Response:
        c = gateway.catalogue
        body = {"ready": c.ready, "generation": c.generation, "problem": c.problem}
        return JSONResponse(body, status_code=200 if c.ready else 503)

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(gateway.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return [Route("/call/{tool:path}", call, methods=["POST"]),
            Route("/calls/{run}/{entry}", get_entry, methods=["GET"]),
            Route("/healthz", healthz), Route("/readyz", readyz), Route("/metrics", metrics)]
