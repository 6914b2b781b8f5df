from django.apps import AppConfig


class PoolConfig(AppConfig):
    name = "pool"
    verbose_name = "Voice pipeline pool"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from pool import checks, signals  # noqa: F401 - registers the system checks and receivers
