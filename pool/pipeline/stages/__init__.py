"""The four stages of a unit: what each thread does with one message, a module each.

A stage handles ``(ctx, message)`` pairs from its inbox and passes work to the next stage
(``base.Stage``). Per-session values live on the stage and are reset by ``end_session()`` when
SESSION_END passes. The loop around ``handle`` (skipping closed sessions, forwarding SESSION_END,
surviving errors) is the unit's (``pool.pipeline.unit``), not the stages'.

A stage imports the pipeline's messages, the backends' base types (``pool.backends.base``; the
models themselves come in the ``Backends`` it is given) and nothing of ``realtime``: wire
decoders and encoders arrive as objects in the messages.
"""
