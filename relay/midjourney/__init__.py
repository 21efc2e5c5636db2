"""The Midjourney-proxy protocol: asynchronous tasks submitted, polled and
billed (service on the client's side, tasks for the store and the poller,
wiring to put both into the app)."""
