"""Calling a tool's upstream: below both the gateway and the undo step.

``client.Upstream`` sends a prepared request (HTTP, or MCP through ``mcp_client``: pooled
sessions over streamable HTTP, or a stdio server started once) and reads the answer;
``client.prepare`` builds the request from a manifest and arguments, with secrets read
through ``secrets.Secrets``. ``errors.Refusal`` is the error envelope a call can be
answered with, and ``limits`` bounds what a call and an answer may carry. The gateway
(``unwind.gateway``) calls tools through it on the agents' behalf, the undo step
(``unwind.undo``) runs the inverses through it: this package imports neither.
"""
