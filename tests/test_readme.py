"""README's commands, run as written, so that README stays true.

The commands are taken from README itself: every line of its ```sh blocks (a line ending
in ``\\`` goes on with the next) and every ``$ `` line of its ```console blocks, each under
the ``##`` section it belongs to.

- **"Try it on a laptop" and "Offline checks"** run here, in order, in one bash (so the
  ``export``s and the background jobs of one block hold for the next, as in a terminal),
  in a fresh copy of the repository (what a commit of the working tree would hold: tracked
  files as edited and new files git does not ignore, so an edit of README is tested before
  it is committed; in CI that is the clone) with this checkout's ``.venv``
  linked in, and with a newcomer's environment: no PYTHONPATH, no virtualenv activated, no
  KUBECONFIG; PATH is what README sets. Each command must exit 0; ``kill %1 %2`` exiting 0
  shows the upstream and the gateway stayed up. For a few, the output README shows is
  checked too. The ports README uses (8787, 8789) must be free: a process left on one of
  them would answer in place of the ones README starts, so the test refuses to run then
  (and says which port) rather than pass against someone else's server.
- **The cluster sections** ("The two commands", "The whole story" and the ``kubectl get``
  at the top) start a real node: `scripts/dev-up.sh` runs install.sh and `unwind dev up`,
  and one node runs per machine, which the cluster tests own while the suite runs. So they
  are not run here. Instead every one of their commands must be listed in ``ON_THE_NODE``
  with the real-node test that runs it (through `unwind.controlplane.dev.up`, exactly what
  `scripts/dev-up.sh` runs, and kubectl / kubectl-unwind with README's arguments), and the
  call that does so must be in that test's source. A command added to README's cluster
  sections fails this test until it is run on the node (or listed as something the suite
  itself is, such as `scripts/test.sh`). README's story was also walked by hand on `unwind
  dev up`, holding the machine's cluster lock.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import signal
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RUN_HERE = ("Try it on a laptop", "Offline checks (GitOps pre-merge)")
CLUSTER = ("", "The two commands", "The whole story: an agent's run, recorded and rolled back")
PORTS = (8787, 8789)


@dataclass(frozen=True)
class Command:
    section: str
    text: str
    shown: tuple[str, ...] = ()  # the output README shows under a `$ ` line


def commands(markdown: str) -> list[Command]:
    """Every command of README's ```sh and ```console blocks, with its ``##`` section."""
    out: list[Command] = []
    section, fence, pending = "", None, ""
    for line in markdown.splitlines():
        if fence is None:
            if line.startswith("## "):
                section = line[3:].strip()
            elif line.startswith("```"):
                fence = line[3:].strip()
            continue
        if line.startswith("```"):
            fence = None
            continue
        if fence == "sh":
            pending += line + "\n" if line.endswith("\\") else line
            if not line.endswith("\\"):
                if pending.strip() and not pending.lstrip().startswith("#"):
                    out.append(Command(section, pending))
                pending = ""
        elif fence == "console":
            if line.startswith("$ "):
                out.append(Command(section, line[2:]))
            elif out and out[-1].section == section:
                last = out[-1]
                out[-1] = Command(section, last.text, (*last.shown, line))
    return out


def test_readme_commands_are_found_in_every_section_that_has_some() -> None:
    found = commands(README.read_text())
    sections = {c.section for c in found}
    assert set(RUN_HERE) | set(CLUSTER) == sections, sections
    assert any("unwind gateway" in c.text and _background(c) for c in found)


# ---- the laptop and offline sections, run -----------------------------------------------

def _fresh_copy(dest: Path) -> Path:
    # what a commit of the working tree would hold: tracked files as edited, and new files
    # not ignored (a tracked module may import one not committed yet)
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is not copied
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    (dest / ".venv").symlink_to(ROOT / ".venv")
    return dest


def _taken(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _script(cmds: list[Command], results: Path) -> str:
    """Each command as README writes it, its output and exit code kept apart (a command
    ending in ``&`` is a background job; ``kill %1 %2`` later says it is still running)."""
    lines = ["set -u"]
    for i, c in enumerate(cmds):
        lines += ["{", c.text, f"}} >{results}/{i}.out 2>{results}/{i}.err </dev/null",
                  f"echo $? >{results}/{i}.rc"]
        if _background(c):
            lines.append(f"echo $! >{results}/{i}.pid")
    return "\n".join(lines) + "\n"


def _background(c: Command) -> bool:
    return re.sub(r"\s+#.*$", "", c.text).rstrip().endswith("&")


def _stop_background(cmds: list[Command], results: Path) -> None:
    """End the background jobs README started, by their pid, if `kill %1 %2` did not."""
    for i, c in enumerate(cmds):
        pid_file = results / f"{i}.pid"
        if not _background(c) or not pid_file.exists():
            continue
        pid = int(pid_file.read_text())
        try:
            alive = Path(f"/proc/{pid}/cwd").resolve() == results.parent / "repo"
        except OSError:
            continue
        if alive:
            os.kill(pid, signal.SIGTERM)


def _newcomer_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "KUBECONFIG", "UNWIND_RUN", "UNWIND_SCOPES")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not p.startswith(str(ROOT)))
    env["NO_COLOR"] = "1"
    return env


def test_the_laptop_and_offline_sections_run_as_written_in_a_fresh_copy(tmp_path: Path) -> None:
    if not (ROOT / ".venv" / "bin" / "unwind").exists():
        pytest.fail(".venv/bin/unwind is missing: run `bash scripts/install.sh` first")
    taken = [p for p in PORTS if _taken(p)]
    assert not taken, (f"127.0.0.1:{taken} in use: README's laptop section listens there; stop "
                       "what listens (a gateway or test upstream left running?) and run again")
    repo = _fresh_copy(tmp_path / "repo")
    results = tmp_path / "results"
    results.mkdir()
    cmds = [c for c in commands(README.read_text()) if c.section in RUN_HERE]
    script = _script(cmds, results)
    try:
        subprocess.run(["bash", "-c", script], cwd=repo, env=_newcomer_env(), timeout=300, check=False)
    finally:
        _stop_background(cmds, results)
    ran = {}
    for i, c in enumerate(cmds):
        out = (results / f"{i}.out").read_text() if (results / f"{i}.out").exists() else ""
        err = (results / f"{i}.err").read_text() if (results / f"{i}.err").exists() else ""
        rc = (results / f"{i}.rc").read_text().strip() if (results / f"{i}.rc").exists() else "not run"
        ran[c.text.split("#")[0].strip()] = out
        assert rc == "0", f"README, {c.section}: `{c.text.strip()}` exited {rc}\n{out}\n{err}"

    def output(start: str) -> str:
        return next(v for k, v in ran.items() if k.startswith(start))

    answer = output("curl -si")
    assert answer.startswith("HTTP/1.1 200 OK"), answer
    assert '"undo":{"kind":"inverse","tool":"github.delete_comment","arguments":{"repo":"octo/hello",' \
           '"comment_id":1}}' in answer, answer
    assert answer.rstrip().endswith('{"id":1,"repo":"octo/hello","body":"hi","issue":7}'), answer
    assert "rolled back: 1 step ran" in output(".venv/bin/unwind rollback")
    readme = README.read_text()
    said = output("unwind validate manifests/").splitlines()[0]
    assert said == "ok: 13 tool manifests valid (code-hosting: 10, payments: 3)"
    assert f"unwind validate manifests/            # {said}" in readme
    assert output("unwind validate .").startswith(
        "ok: 13 tool manifests valid (code-hosting: 10, payments: 3); 2 contract test files checked")


# ---- the cluster sections: run on the real node -----------------------------------------

REAL_NODE = ROOT / "tests" / "cluster" / "test_real_node.py"
FIXTURE = "the module's `dev` fixture (unwind.controlplane.dev.up, as scripts/dev-up.sh runs it)"
# README's command -> (the real-node test or fixture that runs it, the call in its source)
ON_THE_NODE: dict[str, tuple[str, str]] = {
    "bash scripts/dev-up.sh": ("dev", "started = up(workdir)"),
    "kubectl version": ("test_the_node_is_ready_with_containerd_and_the_operator_runs_as_the_charts_deployment",
                        'kubectl(kc, "version")'),
    "kubectl get nodes": ("test_the_node_is_ready_with_containerd_and_the_operator_runs_as_the_charts_deployment",
                          'kubectl(kc, "get", "nodes")'),
    "kubectl events -n code-hosting --for effectledger/demo-run": (
        "test_the_readme_story_runs_in_containers_and_the_demo_pod_completes",
        'kc, "events", "-n", "code-hosting", "--for", "effectledger/demo-run"'),
    "kubectl get toolmanifests -n payments": (
        "manifests", 'kubectl(kc, "wait", "--for=condition=Ready", "toolmanifests", "--all", "-A"'),
    "kubectl apply -f examples/demo-agent.yaml": (
        "test_the_readme_story_runs_in_containers_and_the_demo_pod_completes",
        'kubectl(kc, "apply", "-f", str(ROOT / "examples" / "demo-agent.yaml"))'),
    "kubectl get pod -n code-hosting demo-run": (
        "test_the_readme_story_runs_in_containers_and_the_demo_pod_completes",
        'finished(api, "code-hosting", "demo-run")'),
    "kubectl logs -n code-hosting demo-run -c agent": (
        "test_the_readme_story_runs_in_containers_and_the_demo_pod_completes",
        'kubectl(kc, "-n", "code-hosting", "logs", "demo-run", "-c", "agent")'),
    "kubectl get ledger -n code-hosting": (
        "test_the_readme_story_runs_in_containers_and_the_demo_pod_completes",
        'kubectl(kc, "-n", "code-hosting", "get", "ledger", "demo-run", "-o", "json")'),
    "kubectl unwind plan ledger/demo-run -n code-hosting": (
        "test_the_readme_story_runs_in_containers_and_the_demo_pod_completes",
        'plugin(kc, "plan", "ledger/demo-run", "-n", "code-hosting"'),
    'kubectl unwind rollback ledger/demo-run -n code-hosting --reason "the agent misbehaved" --watch': (
        "test_the_readme_story_runs_in_containers_and_the_demo_pod_completes",
        'plugin(kc, "rollback", "ledger/demo-run", "-n", "code-hosting", "--reason", "the agent misbehaved",'),
    "kubectl get ledger demo-run -n code-hosting -o jsonpath="
    "'{.status.conditions[?(@.type==\"RolledBack\")].status}'": (
        "test_the_readme_story_runs_in_containers_and_the_demo_pod_completes",
        '["RolledBack"] == "True"'),
}
# What the suite itself is, not a command to run inside it.
THE_SUITE = {"bash scripts/test.sh": "the suite: ruff, mypy, the example checks, every test (.ci/run)"}


def _sources(path: Path) -> dict[str, str]:
    """Each top-level function of a test module (tests and fixtures) by name: its source."""
    text = path.read_text()
    tree = ast.parse(text)
    return {n.name: ast.get_source_segment(text, n) or "" for n in tree.body if isinstance(n, ast.FunctionDef)}


def _bare(command: str) -> str:
    return re.sub(r"\s+#.*$", "", command).strip()


def test_every_command_of_readmes_cluster_sections_is_run_by_a_real_node_test() -> None:
    sources = _sources(REAL_NODE)
    cluster = [c for c in commands(README.read_text()) if c.section in CLUSTER]
    assert cluster, "README has no cluster commands any more: update this test"
    for c in cluster:
        bare = _bare(c.text)
        if bare in THE_SUITE:
            continue
        assert bare in ON_THE_NODE, (f"README, {c.section or 'top'}: `{bare}` is run by no real-node "
                                     f"test: run it in {REAL_NODE.name} and list it in ON_THE_NODE")
        test, call = ON_THE_NODE[bare]
        assert test in sources, f"{REAL_NODE.name} has no {test} (it ran `{bare}`)"
        assert call in sources[test], f"{REAL_NODE.name}::{test} no longer runs `{bare}` ({call})"
    assert "kubectl get toolmanifests -A" in (ROOT / "scripts" / "dev-up.sh").read_text()


def test_the_story_lines_readme_shows_are_the_ones_the_real_node_test_asserts() -> None:
    story = _sources(REAL_NODE)["test_the_readme_story_runs_in_containers_and_the_demo_pod_completes"]
    shown = {line for c in commands(README.read_text()) for line in c.shown}
    for line in ("github.create_comment: 200 reversible, ledger demo-run entry comment-1; "
                 "undo: inverse github.delete_comment",
                 "ledger/demo-run: rolled back: 3 steps ran"):
        assert any(line in s for s in shown), f"README no longer shows {line!r}"
        assert line.split(", ledger")[0] in story or line in story


def test_the_kubernetes_versions_readme_shows_are_the_ones_built() -> None:
    from unwind.controlplane.build import PARTS

    control_plane, node = (part.kube_version for part in PARTS)
    shown = {line for c in commands(README.read_text()) for line in c.shown}
    assert f"Server Version: v{control_plane}" in shown and f"Client Version: v{control_plane}" in shown
    assert any(line.split()[:2] == ["unwind-node", "Ready"] and line.split()[-1] == f"v{node}" for line in shown)
