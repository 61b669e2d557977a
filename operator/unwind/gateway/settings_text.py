"""A gateway setting given as JSON text or as a JSON/YAML file's path (``--oauth-config``,
``--rate-limits`` and their environment variables), read into plain data."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def read_settings(text_or_path: str, variable: str, flag: str,
                  error: type[Exception]) -> tuple[Any, str]:
    """The parsed data and where it came from (the variable, or the file's path), or
    ``error`` naming the flag or the file and what is wrong."""
    text, where = text_or_path.strip(), variable
    if not text.startswith("{"):
        where = text
        try:
            text = Path(text).read_text(encoding="utf-8")
        except OSError as exc:
            raise error(f"{flag} {where}: {exc.strerror or exc}") from None
    try:
        import yaml
        return yaml.safe_load(text), where
    except Exception as exc:
        raise error(f"{where}: not JSON or YAML: {exc}") from None
