"""A valid value of any model or type the ledger uses, for tests that walk every field."""

from __future__ import annotations

import types
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

# fields whose strings must match a pattern: a value that does
PATTERNED = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}


def _container(tp: Any) -> bool:
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        return any(_container(a) for a in args if a is not type(None))
    return origin is list or (isinstance(tp, type) and issubclass(tp, BaseModel))


def value_for(tp: Any, mode: str) -> Any:
    """A valid value of type ``tp``. Models hold their required fields; with mode
    ``skeleton`` also every list and model (one item each), so each nested model appears
    with its optional scalars left to their defaults; with ``full`` every field. Open data
    holds an empty string and a null (data, kept as is)."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is Any or origin is dict:
        return {"note": "", "none": None}
    if origin in (Union, types.UnionType):
        return value_for(next(a for a in args if a is not type(None)), mode)
    if origin is Literal:
        return args[0]
    if origin is list:
        return [value_for(args[0], mode)]
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return {name: PATTERNED[name] if name in PATTERNED else value_for(f.annotation, mode)
                for name, f in tp.model_fields.items() if f.is_required() or mode == "full" or (mode == "skeleton" and _container(f.annotation))}
    return {str: "x", int: 1, bool: True, float: 1.0}[tp]
