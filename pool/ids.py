"""Identifiers in OpenAI's style: a short prefix, an underscore, random hex characters."""

import secrets


def new_id(prefix):
    """Return e.g. ``item_3f9a...`` (prefix + 22 hex characters, 88 random bits)."""
    return f"{prefix}_{secrets.token_hex(11)}"
