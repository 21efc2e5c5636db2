"""An SMTP sink on 127.0.0.1 (aiosmtpd): accepts every message and keeps it.

tls="starttls" offers STARTTLS with a self-signed certificate made at start
(the client then runs with smtp_verify_cert off) and refuses mail before
STARTTLS, so a test proves the client really upgraded; tls="tls" speaks TLS
from the first byte (port-465 style).  With auth=(user, password) the sink
requires AUTH (over TLS) and refuses wrong credentials.
"""
from __future__ import annotations

import datetime
import email
import os
import shutil
import ssl
import tempfile
import threading
import warnings
from email import policy

from aiosmtpd.controller import Controller

from tests.helpers import free_port

# Implicit TLS with AUTH: aiosmtpd warns because it only counts STARTTLS as TLS.
warnings.filterwarnings("ignore", message="Requiring AUTH while not requiring TLS")


def _self_signed(dirname: str) -> tuple[str, str]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    cert_path, key_path = os.path.join(dirname, "cert.pem"), os.path.join(dirname, "key.pem")
    with open(cert_path, "wb") as fh:
        fh.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as fh:
        fh.write(key.private_bytes(serialization.Encoding.PEM,
                                   serialization.PrivateFormat.TraditionalOpenSSL,
                                   serialization.NoEncryption()))
    return cert_path, key_path


class _Handler:
    def __init__(self, sink):
        self.sink = sink

    async def handle_DATA(self, server, session, envelope):
        msg = email.message_from_bytes(envelope.content, policy=policy.default)
        with self.sink.lock:
            self.sink.messages.append({"from": envelope.mail_from, "to": list(envelope.rcpt_tos),
                                       "message": msg,
                                       "tls": server.transport.get_extra_info("ssl_object")
                                       is not None,
                                       "login": session.auth_data})
        return "250 OK"


def _authenticator(expected):
    from aiosmtpd.smtp import AuthResult, LoginPassword

    def check(server, session, envelope, mechanism, auth_data):
        ok = (isinstance(auth_data, LoginPassword)
              and (auth_data.login.decode(), auth_data.password.decode()) == expected)
        return AuthResult(success=ok, handled=False,
                          auth_data=auth_data.login if ok else None)
    return check


class SmtpSink:
    def __init__(self, tls: str = "", auth: tuple[str, str] | None = None):
        self.tls = tls
        self.auth = auth
        self.messages: list[dict] = []
        self.lock = threading.Lock()
        self.port = free_port()
        self.controller = None

    def start(self) -> "SmtpSink":
        kw: dict = {}
        if self.tls:
            self._dir = tempfile.mkdtemp()
            cert, key = _self_signed(self._dir)
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(cert, key)
            if self.tls == "starttls":
                kw = {"tls_context": ctx, "require_starttls": True}
            else:
                kw = {"ssl_context": ctx}
        if self.auth:
            # Implicit TLS is encrypted from the start; aiosmtpd only counts STARTTLS.
            kw.update(authenticator=_authenticator(self.auth), auth_required=True,
                      auth_require_tls=self.tls == "starttls")
        self.controller = Controller(_Handler(self), hostname="127.0.0.1", port=self.port, **kw)
        self.controller.start()
        return self

    def stop(self) -> None:
        if self.controller is not None:
            self.controller.stop()
            self.controller = None
        if getattr(self, "_dir", None):  # its throwaway certificate and key
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
