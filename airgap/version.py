"""The version of the ``airgap`` tool (``airgap.__version__``; written into every bundle index).

A leaf module, so that the modules that record the version (:mod:`airgap.pack`) need not
import the package's ``__init__``, which in turn names them (no import circle).
"""

__version__ = "0.1.0"
