"""Rendering a tool's idempotency key from its template and the call's arguments.

``idempotency: {key: "charge-{{args.order_id}}"}`` names the call arguments that make two
calls "the same call". The gateway renders the key before anything else happens and
refuses the call when it cannot: a key rendered from a missing argument, or from a whole
object or list, would be a guess, and a wrong guess either lets a real duplicate through
(charging twice) or refuses a legitimate call forever. So:

- every ``{{...}}`` must be ``{{args.<path>}}`` (dotted names, ``.n`` for a list index);
- the value must be present, not null, and plain: a string, a number or a bool;
- a string is inserted as is, a bool as ``true``/``false`` and a number as its one
  canonical text (below), so equal arguments always give the same key and distinct values
  of one type give distinct keys (the string ``"1"`` and the number ``1`` give the same
  key on purpose: they name the same order to a person, and refusing a look-alike is the
  safe side);
- non-finite numbers (NaN, infinity) are refused: NaN is not even equal to itself.

**One text per number.** JSON does not tell ``42`` from ``42.0`` (a client may send either
for the same order), so a key must not either: rendering ``42.0`` as ``42.0`` let
``stripe.create_charge`` charge order 42 twice. A number's key text is:

- an integral value (an integer, or a float with no fractional part) is written as a plain
  decimal integer: no sign for zero, no fraction, no exponent. ``42``, ``42.0`` and
  ``4.2e1`` give ``42``; ``-0.0`` gives ``0``; ``1e20`` gives ``100000000000000000000``.
  A float's digits are those of its shortest round-trip form, so ``1e300`` gives ``1``
  and 300 zeros, like the integer it names;
- any other (finite) value is written in its shortest round-trip form (Python's ``repr``):
  ``2.5``, ``0.1``, ``1e-07``. One float value has exactly one such text.

The same text fills ``{{args.NAME}}`` placeholders of an upstream URL (``plain_text``).

The template author chooses the separators: ``{{args.a}}-{{args.b}}`` renders ``x-y`` + ``z``
and ``x`` + ``y-z`` alike, which errs on the side of refusing a call as a duplicate.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from .refs import Missing, Ref, RefSyntaxError, parse_ref, resolve

PLACEHOLDER = re.compile(r"\{\{\s*([^}]*?)\s*\}\}")


class KeyRenderError(ValueError):
    """The key cannot be rendered; ``reason`` says why, and the call is refused for it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def placeholders(template: str) -> list[str]:
    """The text inside each ``{{...}}`` of a key template, in order."""
    return [str(name) for name in PLACEHOLDER.findall(template)]


def plain_text(value: Any) -> str | None:
    """The key text of a plain value, or None when the value is not plain."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return number_text(value)
    return None


def number_text(value: int | float) -> str | None:
    """The one canonical text of a JSON number (see the module docstring), or None when it
    has none: NaN, an infinity, or an integer too long to write out."""
    try:
        if isinstance(value, int):
            return str(value)
        if not math.isfinite(value):
            return None
        if value.is_integer():  # 42.0 -> 42, -0.0 -> 0, 1e20 -> 100000000000000000000
            return str(int(Decimal(repr(value))))
        return repr(value)
    except ValueError:  # an integer past Python's int-to-text limit (over 4300 digits)
        return None


def sent_key(m: Any, run: str, key: str) -> str:
    """The key as the upstream sees it. With ``scope: run`` and a header carrier the run is
    part of it (``<run>:<key>``): the rendered key repeats in every run (a CI job, a retried
    agent), and an upstream that replays by key would answer a later run with an effect an
    earlier rollback undid, while both ledgers say succeeded. Elsewhere the rendered key is
    sent as it is (an argument carrier must match what the caller may send itself: lint
    L044 says the upstream sees one key across runs)."""
    idem = getattr(m, "idempotency", None)
    carrier = idem.carrier if idem is not None else None
    if idem is not None and idem.scope == "run" and carrier is not None and carrier.header:
        return f"{run}:{key}"
    return key


@functools.lru_cache(maxsize=1024)
def _names_args(template: str) -> bool:
    """Whether a template names a call argument (parsed once per template: the gateway
    renders the same few templates on every call)."""
    return any(name.startswith("args.") for name in placeholders(template))


@functools.lru_cache(maxsize=4096)
def _arg_ref(name: str) -> Ref | None:
    """A placeholder's reference, parsed once; None when it is not ``args.<path>``."""
    try:
        return parse_ref("$" + name) if name.startswith("args.") else None
    except RefSyntaxError:
        return None


def render_key(template: str, args: Mapping[str, Any]) -> str:
    """Render ``template`` over the call's ``args``, or raise KeyRenderError."""
    if not _names_args(template):
        raise KeyRenderError(
            f"the idempotency key template {template!r} names no {{{{args.<field>}}}}, so "
            "every call would get the same key: add the arguments that identify a call")
    values = dict(args)

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        ref = _arg_ref(name)
        if ref is None or ref.optional:
            raise KeyRenderError(
                f"the idempotency key placeholder {{{{{name}}}}} is not a call argument: "
                "write {{args.<field>}}")
        value = resolve(ref, values, None)
        if isinstance(value, Missing):
            raise KeyRenderError(
                f"the idempotency key needs {{{{{name}}}}} but {value.reason}: the call is "
                "refused rather than keyed on a guess; send the argument")
        text = plain_text(value)
        if text is None:
            raise KeyRenderError(
                f"the idempotency key needs {{{{{name}}}}} to be a string, number or bool, "
                f"but it is {_kind(value)}: the call is refused rather than keyed on a guess")
        return text

    return PLACEHOLDER.sub(one, template)


def _kind(value: Any) -> str:
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, float):
        return f"the non-finite number {value}"
    if isinstance(value, int):
        return "an integer too long to write out"
    return f"a {type(value).__name__}"
