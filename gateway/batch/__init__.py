"""The OpenAI-compatible Batch API: ``/v1/files`` and ``/v1/batches`` (docs/batch.md).

* :mod:`gateway.batch.settings`: the ``batch:`` config section.
* :mod:`gateway.batch.errors`: ``BatchError`` and its codes.
* :mod:`gateway.batch.jsonl`: the input file's format, checked line by line.
* :mod:`gateway.batch.store`: the durable state (files, batches, answers): the protocol;
  ``store_sqlite`` (a file) and ``store_postgres`` (the PostgreSQL audit store's database).
* :mod:`gateway.batch.owner`: who a batch runs as, re-authorised before each request.
* :mod:`gateway.batch.slots`: the runner's slots, round-robin between owners; its retry rule.
* :mod:`gateway.batch.runner`: runs batches through the relay in process, resumes them.
* :mod:`gateway.batch.api`: the HTTP endpoints.

Only the settings are imported here (``gateway.config.settings`` imports this package).
"""

from gateway.batch.settings import BatchSettings

__all__ = ["BatchSettings"]
