"""Package weights (under construction)."""
