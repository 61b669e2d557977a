"""`unwind init`: the files a new tool starts from.

What it writes passes `unwind validate`, `unwind lint --strict` and `unwind test` as it
is, so the first CI run is green for the right reason; every value a person must decide
is marked `# TODO`. A compensable or reversible tool comes with its undo (idempotent) and
the read-only tool that reads the undo back, because such a manifest is not valid without
them; an irreversible one asks for an approval of each call and evidence of the run.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..edit.references import is_object_name, k8s_name
from ..manifest.model import TOOL_NAME_PATTERN

_HEAD = """apiVersion: unwind.dev/v1alpha1
kind: ToolManifest
metadata:
  name: {name}
  namespace: {namespace}
spec:
  tool: {tool}
"""

READ_ONLY = _HEAD + """  description: Read one record.  # TODO: one sentence on what it reads
  effect: read_only
  permission: {team}:read  # TODO: the scope a caller must hold
  owner: [{team}-team@example.com]  # TODO: who to ask when it misbehaves
  risk: {{data_class: internal}}  # TODO: pii, financial, internal...
  timeout_ms: 5s
  retry: {{attempts: 3, base_ms: 200ms, max_ms: 2s}}
"""

IDEMPOTENT = _HEAD + """  description: Set one record to a given state.  # TODO: one sentence on what it changes
  effect: idempotent
  permission: {team}:write  # TODO: the scope a caller must hold
  owner: [{team}-team@example.com]  # TODO: who to ask when it misbehaves
  oncall: {team}-oncall
  risk: {{data_class: internal, blast_radius: low}}  # TODO
  timeout_ms: 10s
"""

# The undo tool (idempotent) and the read-only tool that reads the undo back, which a
# compensable or reversible manifest names.
_UNDO_AND_READ = """---
apiVersion: unwind.dev/v1alpha1
kind: ToolManifest
metadata:
  name: {undo_name}
  namespace: {namespace}
spec:
  tool: {undo}
  description: Delete the record {tool} created.  # TODO
  effect: idempotent
  permission: {team}:write
  owner: [{team}-team@example.com]
  risk: {{data_class: internal}}
  timeout_ms: 10s
---
apiVersion: unwind.dev/v1alpha1
kind: ToolManifest
metadata:
  name: {read_name}
  namespace: {namespace}
spec:
  tool: {read}
  description: Read one record.  # TODO
  effect: read_only
  permission: {team}:read
  owner: [{team}-team@example.com]
  timeout_ms: 5s
"""

COMPENSABLE = _HEAD + """  description: Create one record.  # TODO: one sentence on what it changes
  effect: compensable
  permission: {team}:write  # TODO: the scope a caller must hold
  owner: [{team}-team@example.com]  # TODO: who to ask when it misbehaves
  oncall: {team}-oncall
  risk: {{data_class: internal, blast_radius: medium}}  # TODO
  timeout_ms: 10s
  idempotency: {{key: "{name}-{{{{args.request_id}}}}"}}  # TODO: what makes two calls the same
  compensation:
    tool: {undo}
    kind: compensation
    argument_map: {{id: $result.id}}  # TODO: what the undo needs, from the call and its answer
    residue: [the record stays in the audit log]  # TODO: what a rollback leaves behind
    verification:
      tool: {read}
      arguments: {{id: $result.id}}
      expect: {{status: deleted}}  # TODO: what the read-back answers once undone
""" + _UNDO_AND_READ

REVERSIBLE = _HEAD + """  description: Create one record.  # TODO: one sentence on what it changes
  effect: reversible
  permission: {team}:write  # TODO: the scope a caller must hold
  owner: [{team}-team@example.com]  # TODO: who to ask when it misbehaves
  oncall: {team}-oncall
  risk: {{data_class: internal, blast_radius: low}}  # TODO
  timeout_ms: 10s
  idempotency: {{key: "{name}-{{{{args.request_id}}}}"}}  # TODO: what makes two calls the same
  compensation:
    tool: {undo}
    kind: inverse
    argument_map: {{id: $result.id}}  # TODO: what the inverse needs, from the call and its answer
    deadline: {{within_ms: 1d}}  # TODO: how long the inverse stays possible
    verification:
      tool: {read}
      arguments: {{id: $result.id}}
      absent: true  # TODO: it is gone once undone: a 404 or 410, or [] (or expect: {{path: value}})
""" + _UNDO_AND_READ

IRREVERSIBLE = _HEAD + """  description: Send one message.  # TODO: one sentence on what cannot be taken back
  effect: irreversible
  permission: {team}:send  # TODO: the scope a caller must hold
  owner: [{team}-team@example.com]  # TODO: who to ask when it misbehaves
  oncall: {team}-oncall
  risk: {{data_class: internal, blast_radius: high}}  # TODO
  timeout_ms: 10s
  idempotency: {{key: "{name}-{{{{args.request_id}}}}"}}  # TODO: what makes two calls the same
  approval: {{roles: [{team}-leads]}}  # TODO: who approves each call before it runs
  audit: {{evidence_export: required}}
"""

READ_TEST = """# Contract tests for {tool}: `unwind test tests/contracts -m manifests`.
tests:
  - name: {tool} {why}, so a rollback skips it
    tool: {tool}
    args: {{id: r-1}}  # TODO: a realistic call
    result: {{id: r-1, status: active}}
    expect_plan: skip
"""

COMPENSABLE_TEST = """# Contract tests for {tool}: `unwind test tests/contracts -m manifests`.
tests:
  - name: {tool} is undone by {undo} with the id it returned
    tool: {tool}
    args: {{request_id: q-1}}  # TODO: a realistic call
    result: {{id: r-1}}  # TODO: a realistic answer
    expect_plan: compensate
    expect_handle: {{id: r-1}}
    expect_verification: {{id: r-1}}
    verify_with: {{status: deleted}}
  - name: the same {tool} call twice is refused as a duplicate
    tool: {tool}
    args: {{request_id: q-1}}
    result: {{id: r-1}}
    expect_duplicate: true
  - name: {undo} is safe to repeat
    tool: {undo}
    args: {{id: r-1}}
    expect_plan: skip
  - name: {read} changes nothing
    tool: {read}
    args: {{id: r-1}}
    expect_plan: skip
"""


REVERSIBLE_TEST = """# Contract tests for {tool}: `unwind test tests/contracts -m manifests`.
tests:
  - name: {tool} is undone by its inverse {undo} with the id it returned (compensate, in a contract test)
    tool: {tool}
    args: {{request_id: q-1}}  # TODO: a realistic call
    result: {{id: r-1}}  # TODO: a realistic answer
    expect_plan: compensate
    expect_handle: {{id: r-1}}
    expect_verification: {{id: r-1}}
    verify_status: 404
  - name: the same {tool} call twice is refused as a duplicate
    tool: {tool}
    args: {{request_id: q-1}}
    result: {{id: r-1}}
    expect_duplicate: true
  - name: {undo} is safe to repeat
    tool: {undo}
    args: {{id: r-1}}
    expect_plan: skip
  - name: {read} changes nothing
    tool: {read}
    args: {{id: r-1}}
    expect_plan: skip
"""

IRREVERSIBLE_TEST = """# Contract tests for {tool}: `unwind test tests/contracts -m manifests`.
tests:
  - name: {tool} cannot be taken back (unrecoverable), so a rollback leaves it and says so
    tool: {tool}
    args: {{request_id: q-1}}  # TODO: a realistic call
    result: {{id: m-1}}  # TODO: a realistic answer
    expect_plan: unrecoverable
  - name: the same {tool} call twice is refused as a duplicate
    tool: {tool}
    args: {{request_id: q-1}}
    result: {{id: m-1}}
    expect_duplicate: true
"""

EFFECTS = ("read_only", "idempotent", "reversible", "compensable", "irreversible")


def scaffold(tool: str, effect: str, namespace: str, root: Path) -> dict[Path, str]:
    """{path: text} of the files to write; ValueError for a bad name, FileExistsError when
    a file is already there (nothing is overwritten)."""
    if not re.fullmatch(TOOL_NAME_PATTERN, tool) or tool.endswith("\n"):
        raise ValueError(f"{tool!r} is not a tool name: use 1 to 128 letters, digits and _ . : / -")
    name = k8s_name(tool).strip(".-")
    if not is_object_name(name) or not is_object_name(namespace):
        raise ValueError(f"{tool!r} gives no valid Kubernetes name ({name!r}); or {namespace!r} "
                         "is not a namespace name: use lowercase letters, digits, . and -")
    team = re.split(r"[^a-z0-9]", name)[0] or "team"
    undo, read = f"{tool}.undo", f"{tool}.get"
    values = {"tool": tool, "name": name, "namespace": namespace, "team": team, "undo": undo,
              "read": read, "undo_name": k8s_name(undo), "read_name": k8s_name(read)}
    template = {"read_only": READ_ONLY, "idempotent": IDEMPOTENT, "reversible": REVERSIBLE,
                "compensable": COMPENSABLE, "irreversible": IRREVERSIBLE}[effect]
    test = {"reversible": REVERSIBLE_TEST, "compensable": COMPENSABLE_TEST,
            "irreversible": IRREVERSIBLE_TEST}.get(effect, READ_TEST)
    values["why"] = "changes nothing" if effect == "read_only" else "is safe to repeat"
    files = {root / "manifests" / f"{name}.yaml": template.format(**values),
             root / "tests" / "contracts" / f"{name}.test.yaml": test.format(**values)}
    for path in files:
        if path.exists():
            raise FileExistsError(f"{path} already exists: not overwriting it (choose another "
                                  "tool name or --dir)")
    return files
