"""Package policy (under construction)."""
