"""Optional mutual TLS between the verifier and the worker (ssl module only).

Off unless configured. With ``tls_cert``, ``tls_key`` and ``tls_ca`` set on both
daemons, every connection between them (the wire connection) is TLS 1.3
or nothing, and each side authenticates the other:

- the worker (server) requires a client certificate signed by ``tls_ca``
  (``CERT_REQUIRED``); a client certificate carries no host name, so possession of a
  certificate from that CA is the authorisation: give pp1q its own CA;
- the verifier (client) requires the worker's certificate to be signed by ``tls_ca``
  and to name the worker (``check_hostname``): a DNS name or IP address in its
  subjectAltName must equal ``tls_server_name``, by default the host of ``--worker``;
- only ``tls_ca`` is trusted: the system's public CAs are never loaded.

A failed handshake is counted on the side that detects it
(``pp1q_peers_refused_total{reason="tls_handshake"}``): the worker counts a verifier
without a certificate, with one from another CA, an expired one, or one speaking plain
TCP; the verifier counts a worker whose certificate it does not accept. The count comes
from the TLS object itself (``SSLContext.sslobject_class``), so it holds for the
standard event loop and for uvloop alike. See docs/security.md.
"""

from __future__ import annotations

import logging
import os
import ssl
import stat
from collections.abc import Callable
from dataclasses import dataclass

from pp1q.core.errors import ConfigError
from pp1q.core.outcomes import PeerRefusal
from pp1q.runtime.config import add_setting
from pp1q.runtime.files import check_regular
from pp1q.runtime.metrics import Metrics
from pp1q.runtime.settings import TLS_FILES, DaemonSettings, VerifierSettings

log = logging.getLogger("pp1q.runtime.tls")

MIN_VERSION = ssl.TLSVersion.TLSv1_3  # no downgrade: 1.3 only has forward-secret AEAD suites
HANDSHAKE_TIMEOUT_S = 10.0  # a peer that has not finished the handshake by then is dropped

OnRefused = Callable[[ssl.SSLError], None]  # called once per failed handshake


def add_arguments(p, role: str) -> None:
    add_setting(p, role, "tls_cert", "FILE.pem",
                "this daemon's certificate (PEM, chain allowed); with --tls-key and --tls-ca "
                "turns on mutual TLS between worker and verifier")
    add_setting(p, role, "tls_key", "FILE.pem", "private key of --tls-cert (PEM)")
    add_setting(p, role, "tls_ca", "FILE.pem",
                "the only CA whose certificates are accepted from the peer (PEM)")
    if role == "verifier":
        add_setting(p, role, "tls_server_name", "NAME",
                    "name the worker's certificate must carry (unset: the host of --worker)")


@dataclass(frozen=True)
class ClientTls:
    """What the verifier's connections to the worker pass to asyncio."""

    context: ssl.SSLContext
    server_name: str

    def kwargs(self) -> dict:
        return {"ssl": self.context, "server_hostname": self.server_name,
                "ssl_handshake_timeout": HANDSHAKE_TIMEOUT_S}


def connect_kwargs(tls: ClientTls | None) -> dict:
    """Keyword arguments for ``create_connection`` / ``open_connection`` ({} when off)."""
    return tls.kwargs() if tls is not None else {}


def serve_kwargs(context: ssl.SSLContext | None) -> dict:
    """Keyword arguments for ``create_server`` ({} when off)."""
    if context is None:
        return {}
    return {"ssl": context, "ssl_handshake_timeout": HANDSHAKE_TIMEOUT_S}


def enabled(settings: DaemonSettings) -> bool:
    """True when the three files are set (the settings struct refuses only some)."""
    return bool(settings.tls_cert)


def server_context(settings: DaemonSettings,
                   metrics: Metrics | None = None) -> ssl.SSLContext | None:
    """The worker's context (None when TLS is off); refusals are counted in ``metrics``."""
    if not enabled(settings):
        return None
    return _context(ssl.PROTOCOL_TLS_SERVER, settings, counting(metrics))


def client_tls(settings: VerifierSettings, default_server_name: str,
               metrics: Metrics | None = None) -> ClientTls | None:
    """The verifier's TLS settings for the worker at ``default_server_name`` (None: off)."""
    if not enabled(settings):
        return None
    context = _context(ssl.PROTOCOL_TLS_CLIENT, settings, counting(metrics))
    return ClientTls(context, settings.tls_server_name or default_server_name)


def counting(metrics: Metrics | None) -> OnRefused | None:
    """Log and count a failed handshake as ``peers_refused{reason="tls_handshake"}``."""
    if metrics is None:
        return None

    def refused(e: ssl.SSLError) -> None:
        metrics.logs.log(log, logging.WARNING, ("tls", e.reason),
                         "refused a peer: TLS handshake failed (%s)", e.reason or e)
        metrics.peer_refused(PeerRefusal.TLS_HANDSHAKE)

    return refused


def _context(protocol: int, settings: DaemonSettings,
             on_refused: OnRefused | None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(protocol)  # never create_default_context: no system CAs
    ctx.minimum_version = MIN_VERSION
    ctx.verify_mode = ssl.CERT_REQUIRED  # PROTOCOL_TLS_CLIENT also checks the host name
    cert, key, ca = (getattr(settings, k) for k in TLS_FILES)
    try:
        check_regular(cert)
        check_regular(key)
        key_mode = os.stat(key).st_mode
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"tls_cert = {cert!r}, tls_key = {key!r}: {_why(e)}",
                          key="tls_cert") from None
    if key_mode & stat.S_IRWXO:  # as the draw secret's: a key any local user reads is
        # anyone's certificate (a group the daemon's user is in may read it: 640)
        raise ConfigError(f"tls_key = {key!r}: readable by every user (mode "
                          f"{stat.S_IMODE(key_mode):o}); chmod 600 it", key="tls_key")
    try:
        check_regular(ca)
        ctx.load_verify_locations(cafile=ca)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"tls_ca = {ca!r}: {_why(e)}", key="tls_ca") from None
    if on_refused is not None:
        ctx.sslobject_class = _counting_sslobject(on_refused)
    return ctx


def _why(e: Exception) -> str:
    return getattr(e, "strerror", None) or getattr(e, "reason", None) or str(e)


def _counting_sslobject(on_refused: OnRefused) -> type[ssl.SSLObject]:
    """An SSLObject class whose failed handshakes call ``on_refused`` once each.

    asyncio and uvloop both drive TLS through ``context.wrap_bio``, which builds
    ``context.sslobject_class``; the handshake error surfaces here before the event loop
    closes the connection (and before it would reach any protocol of ours).
    """

    class CountingSSLObject(ssl.SSLObject):
        def do_handshake(self) -> None:
            try:
                super().do_handshake()
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                raise  # more bytes to come: not a failure
            except ssl.SSLError as e:
                on_refused(e)
                raise

    return CountingSSLObject
