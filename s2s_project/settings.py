"""Settings of the stand-alone server: SQLite and the in-memory channel layer by default.

Environment variables: ``DATABASE_URL`` and ``REDIS_URL`` (PostgreSQL and channels-redis, for
several processes), ``DJANGO_SECRET_KEY`` (else a random key kept in ``DJANGO_SECRET_KEY_FILE``,
by default ``~/.config/s2s-realtime/secret_key``), ``DJANGO_DEBUG``, ``DJANGO_ALLOWED_HOSTS`` (comma
separated), ``S2S_POOL_SIZE``, ``S2S_BACKEND``, ``S2S_PRESET``, ``S2S_CACHE_DIR``, ``S2S_LLM_BASE_URL``,
``S2S_LLM_API_KEY``, ``S2S_LLM_API_MODEL``, ``S2S_WEBRTC_HOST_ADDRESSES`` (comma-separated), and ``S2S_JSON`` (any ``S2S`` keys as a JSON object). Everything the apps read is in the ``S2S`` dict,
documented in ``pool/conf.py``.
"""

import json
import os
import tempfile
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent

# Weights come from installed packages only; never let a library reach for a hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")



def _secret_key_from_file():
    """A random key made on first use and kept, mode 0600, outside the repository: there is no
    built-in key that a deployment could forget to replace. Several processes on one machine
    share the file; several machines need one ``DJANGO_SECRET_KEY`` (settings_production).

    The key is written to a temporary file and linked into place, so a process starting at the
    same moment reads a whole key or makes none. Raises ImproperlyConfigured (what to do) when
    the file cannot be made or holds no usable key."""
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management.utils import get_random_secret_key

    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    path = Path(os.environ.get("DJANGO_SECRET_KEY_FILE") or config / "s2s-realtime" / "secret_key")
    try:
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, draft = tempfile.mkstemp(dir=path.parent, prefix=".secret_key.")  # mode 0600
            with os.fdopen(fd, "w") as file:
                file.write(get_random_secret_key())
            try:
                os.link(draft, path)  # fails if another process linked its key first
            except FileExistsError:
                pass
            finally:
                os.unlink(draft)
        key = path.read_text().strip()
    except OSError as exc:
        raise ImproperlyConfigured(f"No secret key: {path} cannot be made or read ({exc.strerror}). Set "
                                   "DJANGO_SECRET_KEY, or DJANGO_SECRET_KEY_FILE to a writable path.") from exc
    if len(key) < 32:
        raise ImproperlyConfigured(f"The secret key in {path} is too short ({len(key)} characters): "
                                   "delete the file to make a new one, or set DJANGO_SECRET_KEY.")
    return key


SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY") or _secret_key_from_file()
DEBUG = os.environ.get("DJANGO_DEBUG", "") == "1"
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]").split(",")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "realtime",
    "pool",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",  # the admin's CSS and JS, straight from the apps
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "s2s_project.urls"
ASGI_APPLICATION = "s2s_project.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# One process: SQLite and the in-memory channel layer. Several processes: DATABASE_URL (e.g.
# postgres://user@127.0.0.1:5432/s2s) and REDIS_URL (e.g. redis://127.0.0.1:6379/0).
if os.environ.get("DATABASE_URL"):
    DATABASES = {"default": dj_database_url.parse(os.environ["DATABASE_URL"], conn_max_age=60)}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("S2S_SQLITE_PATH", BASE_DIR / "db.sqlite3"),
            # Tests write from several threads (the recorder, the test client): a file waits
            # for a lock where the shared-cache in-memory database fails at once.
            "TEST": {"NAME": BASE_DIR / "test-db.sqlite3"},
            # Writers (the recorder thread, admission, the admin) take the write lock when their
            # transaction begins and wait up to 20 s for it, rather than fail with "database is
            # locked" when a read transaction turns into a write. The recorder's retry stays for
            # what waiting cannot fix (PostgreSQL down, a full disk).
            "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20},
        }
    }

if os.environ.get("REDIS_URL"):
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                                  "CONFIG": {"hosts": [os.environ["REDIS_URL"]]}}}
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

AUTH_PASSWORD_VALIDATORS = []
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
# Session recordings (opt-in, RECORD_AUDIO) go through default_storage: files here by default.
MEDIA_ROOT = os.environ.get("DJANGO_MEDIA_ROOT", BASE_DIR / "media")
WHITENOISE_USE_FINDERS = True  # serve from the installed apps: no collectstatic step to forget
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"


def _env(name, cast=str):
    value = os.environ.get(name)
    return None if value in (None, "") else cast(value)




def _s2s_json():
    """``S2S_JSON``: a JSON object of S2S keys. Raises ImproperlyConfigured for anything else."""
    from django.core.exceptions import ImproperlyConfigured

    try:
        value = json.loads(os.environ.get("S2S_JSON") or "{}")
    except json.JSONDecodeError as exc:
        raise ImproperlyConfigured(f"S2S_JSON is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ImproperlyConfigured('S2S_JSON must be a JSON object, e.g. \'{"POOL_SIZE": 4}\'.')
    return value


S2S = {
    # Any S2S key as JSON, e.g. S2S_JSON='{"THREADS": {"llm": 1}}' (benchmarks, deployments).
    **_s2s_json(),
    **{key: value
    for key, value in {
        "POOL_SIZE": _env("S2S_POOL_SIZE", int),
        "BACKEND": _env("S2S_BACKEND"),
        "PRESET": _env("S2S_PRESET"),
        "LLM_BASE_URL": _env("S2S_LLM_BASE_URL"),
        "LLM_API_KEY": _env("S2S_LLM_API_KEY"),
        "LLM_API_MODEL": _env("S2S_LLM_API_MODEL"),
        "WEBRTC_HOST_ADDRESSES": _env("S2S_WEBRTC_HOST_ADDRESSES", lambda v: v.split(",")),
    }.items()
    if value is not None},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "pool": {"handlers": ["console"], "level": "INFO"},
        "realtime": {"handlers": ["console"], "level": "INFO"},
    },
}
