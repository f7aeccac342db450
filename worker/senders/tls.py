"""Client TLS contexts for the senders, built from a :class:`TlsConfig`."""

from __future__ import annotations

import ssl

from ..config import TlsConfig


def client_context(tls: TlsConfig) -> ssl.SSLContext:
    """An ``ssl.SSLContext`` for a client connection.

    Verification is on unless ``insecure_skip_verify``: the peer's chain must lead to
    ``ca_file`` (or the system store when None) and its certificate must name the server
    (``server_name``, else the host; the caller passes it as ``server_hostname``). A client
    certificate is presented when ``cert_file`` is set (``key_file`` defaults to it).

    Raises:
        OSError: a file cannot be read (``ssl.SSLError`` when it is not valid PEM).
        ValueError: ``key_file`` is set without ``cert_file``.
    """
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=tls.ca_file)
    if tls.cert_file:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    elif tls.key_file:
        raise ValueError("tls.key_file needs tls.cert_file")
    if tls.insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context
