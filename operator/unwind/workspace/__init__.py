"""The files of a project folder as the CLI sees them: which are walked (`walk`), and what
each one is (`classify`). Shared by the checks (`unwind validate|lint|test`) and the editor
(`unwind manifests rename|remove`), so both read a repository the same way.

Pure apart from reading the folder tree; no kopf, no Kubernetes client.
"""
