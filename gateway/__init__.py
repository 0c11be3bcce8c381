"""Package gateway (under construction)."""
