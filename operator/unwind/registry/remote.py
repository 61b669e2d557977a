"""A registry folder served as static files, read over HTTPS.

The remote loader is the folder loader over a read-only storage that fetches by URL, so a
version is accepted or refused by exactly the same code (:func:`records.check_version`)
whichever way it was read. Only ``index.json`` and the newest non-draft version of each
tool are fetched.

Plain ``http://`` is refused except on loopback (127.0.0.0/8, ::1, localhost): the
checksums protect against a changed file, but only TLS (or a trusted signing key) protects
against someone on the path serving an older, still self-consistent registry.

Each fetch is one plain GET on one connection (``http.client``, not ``urllib``):

- Redirects are refused, not followed. A static registry has one address, and a followed
  redirect could leave https, or the host, after the base URL was checked.
- A fetch has a deadline (``timeout``, default 10 s) over everything: connecting, the TLS
  handshake, the headers and the body. A socket timeout alone bounds each read, so a
  server sending a byte now and then could hold a fetch for ever; here a watchdog shuts
  the socket at the deadline. A storage also has a deadline for all its fetches together
  (``total_timeout``, default 60 s from its creation: one storage per load).
- A file may not exceed ``max_bytes`` (default 4 MiB): a version is a few KiB and an index
  about 250 bytes per version. A larger announced length is refused before reading.
- Proxy environment variables are not used: the loader connects to the registry's host.

Escaped tool names hold ``%``; in a URL that ``%`` is itself encoded (``%25``), because a
static file server decodes the path once before looking up the file.
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import os
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from ..manifest.model import ToolManifest
from .errors import RegistryError
from .registry import Registry
from .signing import TrustStore
from .state import Generations
from .storage import INDEX_FILE, escape_tool, parse_json

MAX_BYTES = 4 * 1024 * 1024  # a single manifest version is a few KiB; refuse anything silly
TIMEOUT_S = 10.0  # one fetch, start to end
TOTAL_TIMEOUT_S = 60.0  # every fetch of one storage (one load) together
_CHUNK = 64 * 1024


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


class _Watchdog:
    """Shuts a socket at a deadline, so a blocked connect, handshake or read returns."""

    def __init__(self, sock: socket.socket, seconds: float) -> None:
        self.fired = threading.Event()
        self._sock = sock
        self._timer = threading.Timer(max(seconds, 0.0), self._cut)
        self._timer.daemon = True
        self._timer.start()

    def _cut(self) -> None:
        self.fired.set()
        # The plain socket's shutdown: for TLS, the wrapper's own would also drop its state
        # while another thread may be reading through it.
        with contextlib.suppress(OSError):
            socket.socket.shutdown(self._sock, socket.SHUT_RDWR)

    def cancel(self) -> None:
        self._timer.cancel()


class HttpStorage:
    """Read-only storage over a static HTTP(S) copy of a registry folder."""

    def __init__(self, url: str, ca_file: str | os.PathLike[str] | None = None,
                 timeout: float = TIMEOUT_S, total_timeout: float = TOTAL_TIMEOUT_S,
                 max_bytes: int = MAX_BYTES) -> None:
        self.base = check_url(url)
        self.timeout = timeout
        self.total_timeout = total_timeout
        self.max_bytes = max_bytes
        self.load_deadline = time.monotonic() + total_timeout
        self.context: ssl.SSLContext | None = None
        if self.base.startswith("https:"):
            self.context = ssl.create_default_context(
                cafile=os.fspath(ca_file) if ca_file is not None else None)

    def location(self, tool: str | None = None, version: int | None = None) -> str:
        if tool is None or version is None:
            return self.base + INDEX_FILE
        escaped = urllib.parse.quote(escape_tool(tool), safe="")
        return f"{self.base}tools/{escaped}/v{int(version)}.json"

    def _late(self, what: str, url: str, whole: bool) -> RegistryError:
        if whole:
            return RegistryError("remote", f"{what}: {url} was not fetched within the whole "
                                 f"load's deadline of {self.total_timeout:g} s (total_timeout): "
                                 "the registry is too slow or too large to load")
        return RegistryError("remote", f"{what}: {url} did not arrive within the fetch deadline "
                             f"of {self.timeout:g} s: the server is too slow (or sends bytes "
                             "one at a time)")

    def _get(self, url: str, what: str) -> bytes | None:
        now = time.monotonic()
        whole = self.load_deadline <= now + self.timeout  # which deadline binds this fetch
        remaining = min(self.timeout, self.load_deadline - now)
        if remaining <= 0:
            raise self._late(what, url, whole=True)
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if self.context is not None else 80)
        watchdog: _Watchdog | None = None
        conn: http.client.HTTPConnection | None = None
        try:
            raw = socket.create_connection((host, port), timeout=remaining)
            watchdog = _Watchdog(raw, remaining - (time.monotonic() - now))
            sock = (self.context.wrap_socket(raw, server_hostname=host)
                    if self.context is not None else raw)
            conn = http.client.HTTPConnection(host, port)
            conn.sock = sock  # already connected (and its handshake under the watchdog)
            path = parts.path + (f"?{parts.query}" if parts.query else "")
            conn.request("GET", path, headers={"Accept": "application/json"})
            response = conn.getresponse()
            data = self._body(response, url, what, watchdog)
        except (OSError, http.client.HTTPException) as exc:
            if (watchdog is not None and watchdog.fired.is_set()) or time.monotonic() - now >= remaining:
                raise self._late(what, url, whole) from exc
            raise RegistryError("remote", f"{what}: cannot fetch {url}: {exc}") from exc
        finally:
            if watchdog is not None:
                watchdog.cancel()
            if conn is not None:
                conn.close()
        if watchdog is not None and watchdog.fired.is_set():  # cut: not the whole file
            raise self._late(what, url, whole)
        return data

    def _body(self, response: http.client.HTTPResponse, url: str, what: str,
              watchdog: _Watchdog) -> bytes | None:
        status = response.status
        if 300 <= status < 400:
            target = response.getheader("Location", "(no Location header)")
            raise RegistryError("remote", f"{what}: {url} answered HTTP {status}, a redirect to "
                                f"{target}: redirects are refused (each hop could leave https "
                                "or the host); point the registry URL at the final address")
        if status == 404:
            return None
        if status != 200:
            raise RegistryError("remote", f"{what}: {url} answered HTTP {status}")
        announced = response.getheader("Content-Length")
        if announced is not None and announced.strip().isdigit() and int(announced) > self.max_bytes:
            raise self._too_large(what, url)
        chunks: list[bytes] = []
        size = 0
        # read1: at most one read from the socket per call, so the loop sees each chunk
        # (and the watchdog's cut) as it comes, rather than waiting for a full buffer.
        while chunk := response.read1(_CHUNK):
            size += len(chunk)
            if size > self.max_bytes:
                raise self._too_large(what, url)
            chunks.append(chunk)
            if watchdog.fired.is_set():
                break
        return b"".join(chunks)

    def _too_large(self, what: str, url: str) -> RegistryError:
        return RegistryError("remote", f"{what}: {url} is larger than {self.max_bytes} bytes, "
                             "the limit for one registry file (max_bytes): a version is a few "
                             "KiB, so check what this server serves")

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

    def _read_only(self) -> RegistryError:
        return RegistryError("remote", f"{self.base} is read-only: publish to the registry "
                             "folder and serve it again")

    def write_version(self, tool: str, version: int, record: dict[str, Any]) -> None:
        raise self._read_only()

    def update_index(self, change: Callable[[Any | None], dict[str, Any]]) -> None:
        raise self._read_only()

    def list_versions(self) -> None:
        return None  # a static server has no listing to ask for


def load_remote(url: str, trust: TrustStore | None = None,
                ca_file: str | os.PathLike[str] | None = None, *, timeout: float = TIMEOUT_S,
                total_timeout: float = TOTAL_TIMEOUT_S, max_bytes: int = MAX_BYTES,
                generations: Generations | None = None,
                min_generation: int | None = None) -> dict[str, ToolManifest]:
    """The enforceable registry served at ``url`` (see :meth:`Registry.load`): each fetch
    within ``timeout`` seconds and ``max_bytes``, all of them within ``total_timeout``.

    Pass the same ``generations`` (a :class:`MemoryGenerations` kept across reloads, or a
    :class:`FileGenerations`) to every load: with a trust store, an index older than one
    accepted before is then refused (``index_rollback``). ``min_generation`` is a floor
    given by hand. A library call keeps no state unless given one."""
    storage = HttpStorage(url, ca_file, timeout=timeout, total_timeout=total_timeout,
                          max_bytes=max_bytes)
    return Registry(storage, generations=generations).load(trust, min_generation)
