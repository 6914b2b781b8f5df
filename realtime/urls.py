from django.urls import path

from . import views

urlpatterns = [
    path("", views.talk, name="s2s-talk"),
]
