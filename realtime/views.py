"""The browser page: a person talks to the agent over the same Realtime protocol as any client."""

from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.csrf import ensure_csrf_cookie

from pool.access.auth import anonymous_allowed
from pool.backends.voices import OPENAI_VOICES
from pool.conf import get_config


@ensure_csrf_cookie  # the page asks for a client secret with it (realtime.client_secrets)
def talk(request):
    """``GET /``: microphone in, spoken answers out, transcripts, voice and instructions."""
    config = get_config()
    return render(request, "realtime/talk.html", {
        "endpoint": config["REALTIME_PATH"],
        "health_url": reverse("pool:health"),
        "secret_url": reverse("realtime:user-client-secret"),
        "keys_required": not anonymous_allowed(),
        "voices": list(OPENAI_VOICES),
        "default_voice": config["DEFAULT_VOICE"],
        "instructions": config["DEFAULT_INSTRUCTIONS"],
    })
