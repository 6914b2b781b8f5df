"""What a row can hold, on every supported database: one rule for every text that is stored.

PostgreSQL refuses NUL (U+0000) in text and in JSON, no backend can encode an unpaired UTF-16
surrogate as UTF-8, and a column holds at most its ``max_length`` characters. A write that breaks
one of these fails, and with it whatever was written in the same transaction. Client events
cannot carry such text (``realtime.events.loads`` refuses it), but a stored text may also come
from a model, an exception's message or a client's text cut short; so every text goes through
``storable`` (``storable_row`` applies it by the model's own columns) before it is queued for the
database, and no client input can make a write fail.
"""

import re

from django.db import models

TEXT_LIMIT = 10_000  # characters kept of a text (or of each string of a JSON value) without a max_length
_SURROGATE = re.compile("[\ud800-\udfff]")


def storable(text, limit=TEXT_LIMIT):
    """``text`` without NUL, with each unpaired surrogate replaced by U+FFFD (as a UTF-8
    decoder does), and at most ``limit`` characters."""
    if "\x00" in text:
        text = text.replace("\x00", "")
    if not text.isascii():
        text = _SURROGATE.sub("\ufffd", text)
    return text[:limit]


def storable_json(value, limit=TEXT_LIMIT):
    """A JSON value (dicts, lists, scalars) with every string, keys included, ``storable``."""
    if isinstance(value, str):
        return storable(value, limit)
    if isinstance(value, dict):
        return {storable(str(k), limit): storable_json(v, limit) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [storable_json(v, limit) for v in value]
    return value


def storable_row(model, fields):
    """``fields`` (column name -> value) of a row of ``model``, each text made ``storable`` for
    its column: a ``CharField`` to its ``max_length``, a ``TextField`` or ``JSONField`` to
    TEXT_LIMIT."""
    row = {}
    for name, value in fields.items():
        field = model._meta.get_field(name)
        if isinstance(value, str) and isinstance(field, (models.CharField, models.TextField)):
            value = storable(value, field.max_length or TEXT_LIMIT)
        elif isinstance(field, models.JSONField):
            value = storable_json(value)
        row[name] = value
    return row
