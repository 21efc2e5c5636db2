"""What channels turn out not to support, learnt from their own refusals:
the wire they speak (relay/compat/wire.py), and the betas, body fields and
parameters they refuse (relay/compat/rules.py), remembered per channel
(relay/compat/memory.py) and applied to every later request."""
