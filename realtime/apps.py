from django.apps import AppConfig


class RealtimeConfig(AppConfig):
    name = "realtime"
    verbose_name = "Realtime protocol"

    def ready(self):
        from realtime import daphne_close_codes

        daphne_close_codes.install()
