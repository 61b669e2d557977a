"""Benchmarks: each module measures one part of Unwind beside a baseline in the same run.

Run from the repository root, e.g. ``.venv/bin/python -m benchmarks.gateway``
(docs/benchmarks.md lists them with their results). Nothing under ``operator/unwind``
imports this package: the benchmarks may start the local control plane
(``unwind.controlplane``), the production code may not.
"""
