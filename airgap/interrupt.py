"""Signal handling of the ``airgap`` command line: the one implementation in :mod:`weights`."""

from weights import Interrupted, die_by, interruptible

__all__ = ["Interrupted", "die_by", "interruptible"]
