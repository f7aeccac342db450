"""Client TLS for the MLLP and HTTP senders: the ``tls`` node both kinds share (schema,
rendering, Secret keys, configuration) and the ``ssl.SSLContext`` built from it."""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from inturn.worker.senders import shape
from inturn.worker.senders.kind import SecretFile
from inturn.worker.spec.openapi import DNS_SUBDOMAIN, SECRET_KEY, Rule, Schema, boolean, obj, string

#: Default Secret key of the CA bundle: the name cert-manager and ``kubernetes.io/tls`` use.
DEFAULT_CA_KEY = "ca.crt"

RULE_CLIENT_CERT = Rule(
    cel="has(self.certKey) == has(self.keyKey)",
    message="certKey and keyKey must be set together",
    check=lambda node: ("certKey" in node) == ("keyKey" in node),
)


@dataclass(frozen=True)
class TlsConfig:
    """Client TLS for a sender. Paths point at files mounted from Secrets.

    Attributes:
        ca_file: PEM bundle of trusted CAs; None uses the system store.
        cert_file, key_file: client certificate and key (both or neither).
        server_name: name to verify and send as SNI; None uses the host.
        insecure_skip_verify: turn certificate verification off (tests only).
    """

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None
    insecure_skip_verify: bool = False

    def files(self) -> list[str]:
        """The PEM files this configuration reads."""
        return [p for p in (self.ca_file, self.cert_file, self.key_file) if p is not None]


def _secret_ref() -> Schema:
    return obj(
        {
            "name": string(
                "Name of a Secret in the Destination's namespace; mounted into the worker.",
                max_length=253,
                min_length=1,
                pattern=DNS_SUBDOMAIN,
            ),
            "caKey": string(
                "Key of the PEM bundle of trusted CAs.",
                max_length=253,
                min_length=1,
                pattern=SECRET_KEY,
                default=DEFAULT_CA_KEY,
            ),
            "certKey": string(
                "Key of the client certificate (PEM); set together with keyKey.",
                max_length=253,
                min_length=1,
                pattern=SECRET_KEY,
            ),
            "keyKey": string(
                "Key of the client private key (PEM); set together with certKey.",
                max_length=253,
                min_length=1,
                pattern=SECRET_KEY,
            ),
        },
        required=("name",),
        description=(
            "The Secret holding the CA bundle and, optionally, a client certificate and key."
            " The operator mounts it by reference and never reads it."
        ),
        rules=(RULE_CLIENT_CERT,),
    )


def problems(node: Mapping[str, Any] | None) -> list[str]:
    """What a ``tls`` node (spec or rendered) holds that ``ssl`` would refuse at the handshake:
    a server name that is no host name (:func:`inturn.worker.senders.shape.server_name_problem`)."""
    if not node or node.get("serverName") is None:
        return []
    return shape.field("tls.serverName", shape.server_name_problem(node.get("serverName")))


def spec_schema() -> Schema:
    """The ``tls`` node of a sender's spec (a Secret by reference)."""
    return obj(
        {
            "secretRef": _secret_ref(),
            "serverName": string(
                "Name to verify in the receiver's certificate and to send as SNI;"
                " defaults to the host.",
                max_length=253,
                pattern=shape.HOST_PATTERN,
            ),
            "insecureSkipVerify": boolean(
                "Do not verify the receiver's certificate. For tests only.", default=False
            ),
        },
        description=(
            "Client TLS. Without secretRef the system trust store is used and no client"
            " certificate is sent."
        ),
    )


def worker_schema() -> Schema:
    """The ``tls`` node of a rendered sender (Secret keys resolved to file paths)."""
    path = "Absolute path of a PEM file (a mounted Secret key in a cluster)."
    return obj(
        {
            "caFile": string(path, max_length=4096, min_length=1),
            "certFile": string(path, max_length=4096, min_length=1),
            "keyFile": string(path, max_length=4096, min_length=1),
            "serverName": string(
                "Name to verify and send as SNI.", max_length=253, pattern=shape.HOST_PATTERN
            ),
            "insecureSkipVerify": boolean("Do not verify the certificate.", default=False),
        },
        description="Client TLS with the Secret keys resolved to file paths.",
    )


def render(tls: Mapping[str, Any] | None, secret_file: SecretFile) -> dict[str, Any] | None:
    """The rendered ``tls`` node of a spec ``tls`` node (None stays None)."""
    if tls is None:
        return None
    out: dict[str, Any] = {"insecureSkipVerify": tls.get("insecureSkipVerify", False)}
    if tls.get("serverName"):
        out["serverName"] = tls["serverName"]
    ref = tls.get("secretRef")
    if ref:
        out["caFile"] = secret_file(ref["name"], ref.get("caKey", DEFAULT_CA_KEY))
        if "certKey" in ref:
            out["certFile"] = secret_file(ref["name"], ref["certKey"])
            out["keyFile"] = secret_file(ref["name"], ref["keyKey"])
    return out


def secret_keys(tls: Mapping[str, Any] | None) -> dict[str, set[str]]:
    """``{Secret name: keys}`` a spec ``tls`` node mounts."""
    ref = (tls or {}).get("secretRef")
    if not ref:
        return {}
    keys = {ref.get("caKey", DEFAULT_CA_KEY)}
    keys.update(ref[k] for k in ("certKey", "keyKey") if k in ref)
    return {ref["name"]: keys}


def to_dict(tls: TlsConfig | None) -> dict[str, Any] | None:
    """The rendered ``tls`` node of a configuration (None stays None)."""
    if tls is None:
        return None
    out: dict[str, Any] = {"insecureSkipVerify": tls.insecure_skip_verify}
    for key, value in (
        ("caFile", tls.ca_file),
        ("certFile", tls.cert_file),
        ("keyFile", tls.key_file),
        ("serverName", tls.server_name),
    ):
        if value is not None:
            out[key] = value
    return out


def from_dict(doc: Mapping[str, Any] | None) -> TlsConfig | None:
    """The configuration of a rendered ``tls`` node (None stays None)."""
    if doc is None:
        return None
    return TlsConfig(
        ca_file=doc.get("caFile"),
        cert_file=doc.get("certFile"),
        key_file=doc.get("keyFile"),
        server_name=doc.get("serverName"),
        insecure_skip_verify=bool(doc.get("insecureSkipVerify", False)),
    )


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
