"""The shapes of credentials: API keys (``s2s_...``) and client secrets (``ek_...``), how they are
made, recognised, hashed and shown, in one place.

Both are 32 random bytes (256 bits) in URL-safe base64 after their prefix. They are stored as
their sha256: a fast hash is enough for high-entropy secrets (the way GitHub stores tokens);
only their first ``PREFIX_CHARS`` characters are kept in clear, to recognise one in the admin.
"""

import hashlib
import secrets

KEY_PREFIX = "s2s_"
SECRET_PREFIX = "ek_"  # OpenAI's prefix for ephemeral keys, so clients recognise the value
PREFIX_CHARS = 12  # kept in clear (APIKey.prefix, ClientSecret.prefix)


def new_key():
    """A new API key: ``(key, sha256, prefix)``. The clear key exists only in this return value."""
    return _new(KEY_PREFIX)


def new_secret():
    """A new client secret: ``(value, sha256, prefix)``."""
    return _new(SECRET_PREFIX)


def _new(prefix):
    value = prefix + secrets.token_urlsafe(32)
    return value, hash_key(value), value[:PREFIX_CHARS]


def hash_key(value):
    """The sha256 (hex) a key or secret is stored as."""
    return hashlib.sha256(value.encode()).hexdigest()


def is_server_key(value):
    """True for strings shaped like this server's API keys. Anything else (``"local"``, an
    OpenAI key) is a placeholder: anonymous where anonymous access is allowed, refused elsewhere."""
    return value.startswith(KEY_PREFIX)


def is_client_secret(value):
    return value.startswith(SECRET_PREFIX)
