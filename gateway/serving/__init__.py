"""Serving: the process side of ``gateway serve``.

``server`` runs the ASGI app on the gateway's own HTTP/1.1 server (:mod:`gateway.h1`);
``supervisor`` and ``worker`` run N worker processes on one socket; ``reload`` applies a new
configuration live (SIGHUP or a watched file, held from start-up by ``hangup``); ``drain`` ends
the process gracefully on SIGTERM; ``periodic`` runs background rounds in the event loop;
``runtime_tuning`` sets the garbage collector for serving.
"""
