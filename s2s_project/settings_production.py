"""Settings for a production deployment: ``DJANGO_SETTINGS_MODULE=s2s_project.settings_production``.

The stand-alone settings, made safe to face the internet behind a TLS-terminating reverse proxy
(nginx, Caddy) that forwards to ``runpool`` on a loopback or private address. ``manage.py check
--deploy`` passes with it. Required environment variables:

- ``DJANGO_SECRET_KEY``: one key for every process (admin logins are signed with it), 50+ random
  characters (``python -c "from django.core.management.utils import get_random_secret_key as k;
  print(k())"``).
- ``DJANGO_ALLOWED_HOSTS``: the public host names, comma separated.

Optional: ``DJANGO_CSRF_TRUSTED_ORIGINS`` (default ``https://`` + each allowed host), and every
variable of ``s2s_project.settings`` (``DATABASE_URL``, ``REDIS_URL``, ``S2S_JSON`` with
``TRUSTED_PROXIES`` set to the proxy's address).
"""

import os

from django.core.exceptions import ImproperlyConfigured

from .settings import *  # noqa: F403 - this profile is the stand-alone settings, hardened

for _name in ("DJANGO_SECRET_KEY", "DJANGO_ALLOWED_HOSTS"):
    if not os.environ.get(_name):
        raise ImproperlyConfigured(f"{_name} must be set for s2s_project.settings_production "
                                   "(see the module's docstring).")

SECRET_KEY = os.environ["DJANGO_SECRET_KEY"]
DEBUG = False
ALLOWED_HOSTS = os.environ["DJANGO_ALLOWED_HOSTS"].split(",")
CSRF_TRUSTED_ORIGINS = (os.environ.get("DJANGO_CSRF_TRUSTED_ORIGINS", "").split(",")
                        if os.environ.get("DJANGO_CSRF_TRUSTED_ORIGINS")
                        else [f"https://{host}" for host in ALLOWED_HOSTS])

# TLS ends at the proxy, which says so in X-Forwarded-Proto (set it there, and nowhere else).
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = True
# Load balancers and Prometheus reach the process directly, over plain HTTP.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SECURE_HSTS_SECONDS = int(os.environ.get("DJANGO_HSTS_SECONDS", 60 * 60 * 24 * 365))
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
# Submitting a domain to the browsers' HSTS preload list is the domain owner's decision.
SILENCED_SYSTEM_CHECKS = ["security.W021"]
