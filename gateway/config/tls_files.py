"""Start-up check of the TLS files a config names (listener and upstream), naming the key.

``gateway check-config`` and ``gateway serve`` run it before anything listens, so a missing or
mismatched certificate is one ``config_error`` line (``listen.tls_key_file: cannot read
/etc/sg/tls.key: No such file or directory``) instead of an exception from the TLS layer.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from clishell import not_regular
from gateway.config.settings import GatewaySettings
from gateway.errors import ConfigError

__all__ = ["check_tls_files"]


def _readable(key: str, path: Path | None) -> None:
    if path is None:
        return
    if not_regular(path):  # checked here, loaded by name by the TLS layer: read twice
        raise ConfigError(f"{key}: {path} is not a regular file (a pipe or FIFO is read once; "
                          "the TLS layer reads it again by name): give a file")
    try:
        with path.open("rb") as fh:
            fh.read(1)
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {path}: {exc.strerror}") from exc


def _pair(section: str, cert_key: str, key_key: str, cert: Path | None, key: Path | None) -> None:
    _readable(f"{section}.{cert_key}", cert)
    _readable(f"{section}.{key_key}", key)
    if cert is None or key is None:
        return
    side = ssl.PROTOCOL_TLS_SERVER if section == "listen" else ssl.PROTOCOL_TLS_CLIENT
    ctx = ssl.SSLContext(side)
    try:
        ctx.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"{section}: {cert_key} {cert} and {key_key} {key} are not a matching PEM "
            f"certificate and private key ({exc})"
        ) from exc


def check_tls_files(settings: GatewaySettings) -> None:
    """Check that every TLS file of ``listen`` and ``upstream_tls`` loads.

    Raises:
        ConfigError: Naming the key and the file: unreadable, not PEM, or key not matching.
    """
    listen = settings.listen
    _pair("listen", "tls_cert_file", "tls_key_file", listen.tls_cert_file, listen.tls_key_file)
    up = settings.upstream_tls
    _readable("upstream_tls.ca_file", up.ca_file)
    if up.ca_file is not None:
        try:
            ssl.create_default_context(cafile=str(up.ca_file))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"upstream_tls.ca_file: {up.ca_file} is not a PEM CA bundle ({exc})"
            ) from exc
    _pair("upstream_tls", "cert_file", "key_file", up.cert_file, up.key_file)
