from django.apps import AppConfig


class RealtimeConfig(AppConfig):
    name = "realtime"
    verbose_name = "Realtime protocol"
