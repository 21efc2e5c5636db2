"""Money: what a call costs and who pays it.

Prices (pricing, price_catalogue) and estimates (tokenizer, audio_length);
billing, the one object every charge moves through, over the leases a process
holds, the recalls by which relays sharing a database give leases back
(recalls), the journal of usage records and the flusher that makes them
durable; why a call is refused (refusals); what a person is shown of a balance
(shown); the relay processes sharing a database (processes); usage events
(usage); rate and concurrency limits, kept with the same lease-and-heartbeat
design (limits, permits).  leases.py explains the design."""
