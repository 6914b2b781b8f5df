from django.urls import path

from realtime import client_secrets, views

urlpatterns = [
    path("", views.talk, name="s2s-talk"),
    path("v1/realtime/client_secrets", client_secrets.create, name="s2s-client-secrets"),
    path("client_secret", client_secrets.create_for_user, name="s2s-user-client-secret"),
]
