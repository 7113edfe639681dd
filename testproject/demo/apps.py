from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "testproject.demo"
    default_auto_field = "django.db.models.BigAutoField"
