"""Settings for a production deployment: ``DJANGO_SETTINGS_MODULE=s2s_project.settings_production``.

The stand-alone settings, made safe to face the internet behind a TLS-terminating reverse proxy
(nginx, Caddy) that forwards to ``runpool`` on a loopback or private address. ``manage.py check
--deploy`` passes with it. Required environment variables:

- ``DJANGO_SECRET_KEY``: one key for every process (admin logins are signed with it), 50+ random
  characters (``python -c "from django.core.management.utils import get_random_secret_key as k;
  print(k())"``).
- ``DJANGO_ALLOWED_HOSTS``: the public host names, comma separated, and the address a load
  balancer or Prometheus uses to reach the process directly.

Optional: ``DJANGO_CSRF_TRUSTED_ORIGINS`` (default ``https://`` + each allowed host), and every
variable of ``s2s_project.settings`` (``DATABASE_URL``, ``REDIS_URL``, ``S2S_JSON`` with
``TRUSTED_PROXIES`` set to the proxy's address).
"""

import os

from django.core.exceptions import ImproperlyConfigured

# Checked before the stand-alone settings load: they would make a key file for a missing key.
for _name in ("DJANGO_SECRET_KEY", "DJANGO_ALLOWED_HOSTS"):
    if not os.environ.get(_name, "").strip(", "):
        raise ImproperlyConfigured(f"{_name} must be set for s2s_project.settings_production "
                                   "(see the module's docstring).")

from .settings import *  # noqa: E402, F403 - this profile is the stand-alone settings, hardened

SECRET_KEY = os.environ["DJANGO_SECRET_KEY"]
DEBUG = False
ALLOWED_HOSTS = [host for host in os.environ["DJANGO_ALLOWED_HOSTS"].split(",") if host]
CSRF_TRUSTED_ORIGINS = (os.environ.get("DJANGO_CSRF_TRUSTED_ORIGINS", "").split(",")
                        if os.environ.get("DJANGO_CSRF_TRUSTED_ORIGINS")
                        else [f"https://{host}" for host in ALLOWED_HOSTS])

# TLS ends at the proxy, which says so in X-Forwarded-Proto (set it there, and nowhere else).
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = True
# Load balancers and Prometheus reach the process directly, over plain HTTP (add the address
# they use to DJANGO_ALLOWED_HOSTS, e.g. "voice.example.com,10.0.0.5").
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$", r"^v1/pool$"]
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
try:
    SECURE_HSTS_SECONDS = int(os.environ.get("DJANGO_HSTS_SECONDS", 60 * 60 * 24 * 365))
except ValueError:
    raise ImproperlyConfigured("DJANGO_HSTS_SECONDS must be a whole number of seconds.") from None
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
# Submitting a domain to the browsers' HSTS preload list is the domain owner's decision.
SILENCED_SYSTEM_CHECKS = ["security.W021"]
