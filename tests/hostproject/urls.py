from django.contrib import admin
from django.urls import include, path

from .hostapp.views import home

urlpatterns = [
    path("", home),
    path("backoffice/", admin.site.urls),
    path("voice/", include("realtime.urls")),
    path("voice/", include("pool.urls")),
]
