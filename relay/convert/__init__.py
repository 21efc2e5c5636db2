"""Pure conversions between the vendors' wire formats and the canonical
OpenAI shape.  No I/O here: faces (inbound) and adaptors (outbound) share
these, so each pair's logic exists once."""
