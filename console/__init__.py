"""The web console's domain: public status, usage statistics, strings and
the built-in chat.  Handlers in handlers/console*.py stay thin over these."""
