from django.urls import path

from pool import views

urlpatterns = [
    path("healthz", views.health, name="s2s-health"),
    path("v1/pool", views.pool_status, name="s2s-pool-status"),
    path("metrics", views.metrics, name="s2s-metrics"),
]
