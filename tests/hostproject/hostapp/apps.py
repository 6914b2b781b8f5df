from django.apps import AppConfig


class HostAppConfig(AppConfig):
    name = "tests.hostproject.hostapp"
    label = "hostapp"
