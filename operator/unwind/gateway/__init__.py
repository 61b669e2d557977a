"""The gateway: every tool call enforced, reported, and written ahead to the ledger.

One enforcement function (``enforce.Gateway.call``) serves both doors, REST
(``POST /call/<tool>``) and MCP (``/mcp``). What differs between a laptop and a pod is
behind protocols: where manifests come from (``catalogue.Catalogue``), where entries and
key locks live (``unwind.ledger.store.Store`` / ``Locks``) and where secrets are read
(``unwind.upstream.secrets.Secrets``). The upstream client is ``unwind.upstream``, which
the undo step shares without importing this package. Nothing here imports the Kubernetes
client or kopf: the sidecar runs in 90 MB.
"""
