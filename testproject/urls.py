from django.contrib import admin
from django.urls import path

from testproject.demo import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("enqueue/", views.enqueue, name="enqueue"),
]
