"""Sensitive data: the policy's ``pii`` section applied to requests (``request``, before
routing) and to what a model answers (``response``, masking streamed or whole answers)."""
