"""Header values from Secrets: ``{secretKeyRef: {name, key}}`` in a manifest's upstream.

One interface, two sources in local mode: a folder laid out as a pod's Secret mount
(``DIR/<name>/<key>``, the form a sidecar reads too), then the environment
(``UNWIND_SECRET_<NAME>_<KEY>``: upper case, every character that is not a letter or
digit becomes ``_``). A missing value is an error naming both places to put it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol


class SecretMissing(Exception):
    """The value is in neither place; the message says where to put it."""


class Secrets(Protocol):
    def get(self, name: str, key: str) -> str: ...


def env_name(name: str, key: str) -> str:
    return "UNWIND_SECRET_" + re.sub(r"[^A-Z0-9]", "_", f"{name}_{key}".upper())


_SAFE = re.compile(r"[A-Za-z0-9._-]{1,253}")


class LocalSecrets:
    def __init__(self, directory: str | os.PathLike[str] | None = None,
                 environ: Mapping[str, str] | None = None) -> None:
        self.directory = Path(directory) if directory else None
        self.environ = os.environ if environ is None else environ

    def get(self, name: str, key: str) -> str:
        if self.directory is not None and _SAFE.fullmatch(name) and _SAFE.fullmatch(key) \
                and not {name, key} & {".", ".."}:
            path = self.directory / name / key
            try:
                return path.read_text(encoding="utf-8").rstrip("\n")
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise SecretMissing(f"cannot read secret {name}/{key} from {path}: "
                                    f"{exc.strerror or exc}") from None
        value = self.environ.get(env_name(name, key))
        if value is not None:
            return value
        where = f"{self.directory / name / key} or " if self.directory else ""
        raise SecretMissing(f"secret {name}, key {key} is not available: put it in "
                            f"{where}the environment variable {env_name(name, key)}")
