"""Outbound HTTP: the only code that talks to upstream channels.

client.Upstream over curl_client's CurlClient (one Transfer each), a limit
per kind of work (gate), and multipart uploads spooled and streamed on
(upload)."""
