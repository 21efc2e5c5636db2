"""What the relay serves on: the event loop and the process's set-up, the
wire-level readers and writers every face shares (jsonin for request bodies,
sse for event streams), stopping background loops and logging real bugs."""
