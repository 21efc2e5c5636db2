"""E-mail to the subscriber's login address, through the server-wide SMTP relay."""
from __future__ import annotations

import ssl
from email.message import EmailMessage
from email.utils import formatdate, make_msgid

import aiosmtplib

from notify.channels.base import Channel, Context, DeliveryError, Message


class EmailChannel(Channel):
    type = "email"
    label = "E-mail"
    fields = ()  # the address is the account's login e-mail

    async def send(self, msg: Message, config: dict, ctx: Context) -> str:
        s = ctx.settings
        to = (msg.user or {}).get("email") or ""
        if not to:
            raise DeliveryError("The account has no e-mail address.", permanent=True)
        if not s.smtp_host:
            raise DeliveryError("E-mail is not set up on this server (smtp_host is empty).",
                                permanent=True)
        mail = EmailMessage()
        mail["From"] = s.smtp_from or s.smtp_user or f"relay@{s.smtp_host}"
        mail["To"] = to
        mail["Subject"] = " ".join(msg.title.split())  # no header injection by newline
        mail["Date"] = formatdate(localtime=False)
        # The outbox id doubles as Message-ID, so a receiver can drop a
        # duplicate after a crash between sending and recording.
        domain = (mail["From"].split("@", 1) + ["relay"])[1].strip("> ")
        mail["Message-ID"] = make_msgid(idstring=msg.id.replace(":", "."), domain=domain)
        mail.set_content(msg.content or msg.title)
        mode = (s.smtp_tls or "starttls").lower()
        tls_ctx = ssl.create_default_context()
        if not s.smtp_verify_cert:
            tls_ctx.check_hostname = False
            tls_ctx.verify_mode = ssl.CERT_NONE
        try:
            await aiosmtplib.send(
                mail, hostname=s.smtp_host, port=int(s.smtp_port),
                username=s.smtp_user or None, password=s.smtp_password or None,
                use_tls=mode == "tls", start_tls=True if mode == "starttls" else False,
                tls_context=tls_ctx if mode != "none" else None,
                timeout=ctx.http.timeout)
        except aiosmtplib.SMTPRecipientsRefused as exc:
            raise DeliveryError(f"The mail server refused {to}: {exc}") from None
        except (aiosmtplib.SMTPException, OSError) as exc:
            raise DeliveryError(f"SMTP {s.smtp_host}:{s.smtp_port}: {exc}") from None
        return f"mailed {to}"
