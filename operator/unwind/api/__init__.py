"""Resource models for ToolManifest, EffectLedger and Approval (no kopf, no client)."""
