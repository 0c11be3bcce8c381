"""Package airgap (under construction)."""
