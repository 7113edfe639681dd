from django.contrib import admin
from django.urls import path

from django_cogworker.metrics import metrics_view
from testproject.demo import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("enqueue/", views.enqueue, name="enqueue"),
    path("cogworker/metrics", metrics_view, name="cogworker-metrics"),
]
