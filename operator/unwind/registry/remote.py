"""A registry folder served as static files, read over HTTPS.

The remote loader is the folder loader over a read-only storage that fetches by URL, so a
version is accepted or refused by exactly the same code (:func:`records.check_version`)
whichever way it was read. Only ``index.json`` and the newest non-draft version of each
tool are fetched.

Plain ``http://`` is refused except on loopback (127.0.0.0/8, ::1, localhost): the
checksums protect against a changed file, but only TLS (or a trusted signing key) protects
against someone on the path serving an older, still self-consistent registry.

Escaped tool names hold ``%``; in a URL that ``%`` is itself encoded (``%25``), because a
static file server decodes the path once before looking up the file.
"""

from __future__ import annotations

import ipaddress
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from ..manifest.model import ToolManifest
from .errors import RegistryError
from .registry import Registry
from .signing import TrustStore
from .storage import INDEX_FILE, escape_tool, parse_json

MAX_BYTES = 4 * 1024 * 1024  # a single manifest version is a few KiB; refuse anything silly
TIMEOUT_S = 10.0


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_url(url: str) -> str:
    """The URL with a trailing slash, or RegistryError ``remote`` when it is refused."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return url.rstrip("/") + "/"
    if parts.scheme == "http" and parts.hostname and _is_loopback(parts.hostname):
        return url.rstrip("/") + "/"
    if parts.scheme == "http":
        raise RegistryError("remote", f"refusing {url}: a remote registry must use https:// "
                            "(plain http:// is only allowed on 127.0.0.1, ::1 or localhost)")
    raise RegistryError("remote", f"{url} is not an https:// URL of a registry")


class HttpStorage:
    """Read-only storage over a static HTTP(S) copy of a registry folder."""

    def __init__(self, url: str, ca_file: str | os.PathLike[str] | None = None,
                 timeout: float = TIMEOUT_S) -> None:
        self.base = check_url(url)
        self.timeout = timeout
        self.context: ssl.SSLContext | None = None
        if self.base.startswith("https:"):
            self.context = ssl.create_default_context(
                cafile=os.fspath(ca_file) if ca_file is not None else None)

    def location(self, tool: str | None = None, version: int | None = None) -> str:
        if tool is None or version is None:
            return self.base + INDEX_FILE
        escaped = urllib.parse.quote(escape_tool(tool), safe="")
        return f"{self.base}tools/{escaped}/v{int(version)}.json"

    def _get(self, url: str, what: str) -> bytes | None:
        request = urllib.request.Request(url, headers={"Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self.context) as resp:
                data: bytes = resp.read(MAX_BYTES + 1)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise RegistryError("remote", f"{what}: {url} answered HTTP {exc.code}") from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise RegistryError("remote", f"{what}: cannot fetch {url}: {reason}") from exc
        if len(data) > MAX_BYTES:
            raise RegistryError("remote", f"{what}: {url} is larger than {MAX_BYTES} bytes")
        return data

    def read_index(self) -> Any | None:
        url = self.location()
        data = self._get(url, "the registry index")
        return None if data is None else parse_json(data, url)

    def read_version(self, tool: str, version: int) -> Any:
        url = self.location(tool, version)
        data = self._get(url, f"{tool} v{version}")
        if data is None:
            raise RegistryError("missing", f"{tool} v{version}: {url} was not found (HTTP 404)")
        return parse_json(data, f"{tool} v{version}: {url}")

    def write_version(self, tool: str, version: int, record: dict[str, Any],
                      index: dict[str, Any]) -> None:
        raise RegistryError("remote", f"{self.base} is read-only: publish to the registry "
                            "folder and serve it again")


def load_remote(url: str, trust: TrustStore | None = None,
                ca_file: str | os.PathLike[str] | None = None) -> dict[str, ToolManifest]:
    """The enforceable registry served at ``url`` (see :meth:`Registry.load`)."""
    return Registry(HttpStorage(url, ca_file)).load(trust)
