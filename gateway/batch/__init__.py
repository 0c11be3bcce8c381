"""The OpenAI-compatible Batch API: ``/v1/files`` and ``/v1/batches`` (docs/batch.md).

* :mod:`gateway.batch.settings`: the ``batch:`` config section.
* :mod:`gateway.batch.errors`: ``BatchError`` and its codes.
* :mod:`gateway.batch.jsonl`: the input file's format, checked line by line.
* :mod:`gateway.batch.store`: the durable SQLite state (files, batches, answers).
* :mod:`gateway.batch.runner`: runs batches through the relay in process, resumes them.
* :mod:`gateway.batch.api`: the HTTP endpoints.

Only the settings are imported here (``gateway.config.settings`` imports this package).
"""

from gateway.batch.settings import BatchSettings

__all__ = ["BatchSettings"]
