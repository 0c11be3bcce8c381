"""The relay: one OpenAI-style request from the parsed body to the replica and back.

``pipeline`` runs the request's stages in order (:data:`gateway.relay.pipeline.STAGES`) from
its ASGI entry ``serve``; ``rewrite`` inspects and minimally rewrites the request body and
scans the streamed response for the usage it forced; ``forward`` sends it to a replica with
retries and timeouts through ``upstream`` (or ``litellm_backend``); ``records`` is the
per-request record the observers (audit, quotas, telemetry) receive; ``retry_after`` relays a
replica's back-off.
"""
