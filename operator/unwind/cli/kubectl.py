"""kubectl as the plugin's API client.

The plugin commands (`unwind approve|deny|history|diff|status`, run as `kubectl unwind ...`)
make every API call by running ``kubectl`` itself, passing through the connection flags a
user gave. So whatever works for ``kubectl get`` works here, exactly as it does there:
exec credential plugins, OIDC, client certificates, ``--as`` impersonation, the context's
namespace, ``$KUBECONFIG`` with several files. A Python client would have to re-implement
each of those and would drift.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

# The kubectl flags the plugin honours: flag -> takes a value. Kept here so that `main`
# can move them from before the command to after it (`kubectl unwind -n ns status` runs
# `kubectl-unwind -n ns status`: kubectl hands the plugin every word after its name).
KUBE_FLAGS = {"--kubeconfig": True, "--context": True, "-n": True, "--namespace": True,
              "--as": True, "--as-group": True}


def hoist_kube_flags(argv: Sequence[str], commands: Sequence[str]) -> list[str]:
    """Move the kubectl connection flags that come before a plugin command to after it."""
    leading: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        name = word.split("=", 1)[0]
        if name not in KUBE_FLAGS:
            break
        takes = KUBE_FLAGS[name] and "=" not in word
        leading.extend(argv[i:i + 1 + takes])
        i += 1 + takes
    if not leading or i >= len(argv) or argv[i] not in commands:
        return list(argv)
    return [argv[i], *leading, *argv[i + 1:]]


def add_kube_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("kubectl flags (passed to kubectl as they are)")
    g.add_argument("--kubeconfig", help="kubeconfig file (default $KUBECONFIG, then ~/.kube/config)")
    g.add_argument("--context", help="the kubeconfig context to use")
    g.add_argument("-n", "--namespace", help="namespace (default: the context's namespace, else default)")
    g.add_argument("--as", dest="as_user", metavar="USER", help="impersonate this user")
    g.add_argument("--as-group", dest="as_groups", action="append", default=[], metavar="GROUP",
                   help="impersonate this group (repeatable)")


class KubectlError(Exception):
    """kubectl failed; ``reason`` is the API status reason when it printed one
    (NotFound, Forbidden, AlreadyExists, ...), else ``""``."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


# klog's lines (`E1130 08:12:50.048728  1862 memcache.go:265] ...`) repeat what the last line says.
_KLOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ \S+:\d+\] ")
_SERVER = re.compile(r"^Error from server(?: \((?P<reason>\w+)\))?: ")
_NOISE = (re.compile(r'^error when (?:creating|retrieving current configuration of) "[^"]*": '),
          re.compile(r'^admission webhook "[^"]*" denied the request: '))


def error_from_stderr(stderr: str) -> KubectlError:
    """kubectl's error output as one message a person reads: without the request
    plumbing (`Error from server`, `error when creating "STDIN"`, the webhook's name)."""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    text = "\n".join(line for line in lines if not _KLOG.match(line)) or (lines[-1] if lines else "")
    match = _SERVER.match(text)
    reason = (match.group("reason") or "") if match else ""
    if match:
        text = text[match.end():]
    for noise in _NOISE:
        text = noise.sub("", text)
    text = text.removeprefix("error: ")
    return KubectlError(text or "kubectl failed without a message", reason)


@dataclass(frozen=True)
class Kubectl:
    """Runs kubectl with the user's connection flags and the resolved namespace."""

    flags: tuple[str, ...] = ()
    namespace: str | None = None
    binary: str = "kubectl"

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Kubectl:
        found = shutil.which("kubectl")
        if found is None:
            raise KubectlError("kubectl is not on PATH: the unwind plugin makes every API call "
                               "through kubectl; install kubectl, or put it on PATH")
        flags: list[str] = []
        for flag, value in (("--kubeconfig", args.kubeconfig), ("--context", args.context),
                            ("--as", args.as_user)):
            if value:
                flags.append(f"{flag}={value}")
        flags.extend(f"--as-group={g}" for g in args.as_groups or ())
        base = cls(tuple(flags), None, found)
        return replace(base, namespace=args.namespace or base.context_namespace())

    def context_namespace(self) -> str | None:
        """The namespace kubectl would use: the current context's, else "default"; None
        when there is no kubeconfig to read (in a pod kubectl picks the pod's namespace
        itself, so no --namespace is passed then)."""
        proc = self._run(["config", "view", "--minify", "-o", "jsonpath={..namespace}"])
        if proc.returncode != 0:
            return None  # a kubeconfig that is wrong is reported by the first real call
        return proc.stdout.strip() or "default"

    @property
    def where(self) -> str:
        return f"namespace {self.namespace}" if self.namespace else "kubectl's default namespace"

    def _run(self, args: Sequence[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.binary, *self.flags, *args], input=stdin, capture_output=True,
                              text=True, check=False)

    def run(self, *args: str, stdin: str | None = None) -> str:
        """Run a namespaced kubectl command; its stdout, or KubectlError."""
        ns = ["--namespace", self.namespace] if self.namespace else []
        proc = self._run([*ns, *args], stdin)
        if proc.returncode != 0:
            raise error_from_stderr(proc.stderr)
        return proc.stdout

    def json(self, *args: str, stdin: str | None = None) -> Any:
        out = self.run(*args, "-o", "json", stdin=stdin)
        try:
            return json.loads(out)
        except ValueError as exc:
            raise KubectlError(f"kubectl {' '.join(args)} did not print JSON: {exc}") from None

    def get(self, resource: str, name: str | None = None, *selector: str) -> Any:
        return self.json("get", resource, *([name] if name else []), *selector)

    def items(self, resource: str, *selector: str) -> list[dict[str, Any]]:
        found = self.get(resource, None, *selector)
        items = found.get("items") if isinstance(found, dict) else None
        return [i for i in items or [] if isinstance(i, dict)]

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        created = self.json("create", "-f", "-", stdin=json.dumps(body))
        if not isinstance(created, dict):
            raise KubectlError("kubectl create did not print the created object")
        return created
