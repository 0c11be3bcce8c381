"""sovereign-gateway: an OpenAI-compatible gateway in front of self-hosted vLLM.

Start at :func:`gateway.assembly.assemble` (the components, built from the settings) and
:func:`gateway.app.create_app` (the ASGI app); docs/architecture.md draws both.
"""
