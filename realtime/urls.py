"""The Realtime protocol's HTTP endpoints and the browser page, in the ``realtime`` namespace:
``reverse("realtime:client-secrets")``. The WebSocket route is in ``realtime.routing``."""

from django.urls import path

from realtime import client_secrets, views
from realtime.webrtc import calls

app_name = "realtime"

urlpatterns = [
    path("", views.talk, name="talk"),
    path("v1/realtime/client_secrets", client_secrets.create, name="client-secrets"),
    path("v1/realtime/calls", calls.create, name="calls"),
    path("v1/realtime/calls/<str:call_id>/hangup", calls.hangup, name="call-hangup"),
    path("client_secret", client_secrets.create_for_user, name="user-client-secret"),
]
