"""Unwind: declared, approved, signed, recorded and undoable tool-call effects on Kubernetes."""

__version__ = "0.1.0"

API_GROUP = "unwind.dev"
API_VERSION = "v1alpha1"
