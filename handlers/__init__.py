"""Thin Tornado handlers: each module ends with its own `default_handlers` list."""
