"""The pool's HTTP endpoints, in the ``pool`` namespace: ``reverse("pool:health")``."""

from django.urls import path

from pool import views

app_name = "pool"

urlpatterns = [
    path("healthz", views.health, name="health"),
    path("v1/pool", views.pool_status, name="status"),
    path("metrics", views.metrics, name="metrics"),
]
