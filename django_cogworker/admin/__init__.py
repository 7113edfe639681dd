"""The Cogworker pages in the Django admin.

How they hook in: ``models`` defines one unmanaged, tableless model per page (Dashboard,
Queues, Processes, Scheduled, Retries, Dead, Job batches, Limits, Periodic, Quarantine), and
each is registered here with :class:`PageAdmin`, a ModelAdmin whose URLs are
the page's own views (``urls.page_urls``) instead of a changelist and forms.
So the admin index, the app index and the sidebar list the pages under
"Cogworker" with the admin's own machinery (no template overrides, no patched
AdminSite), and every page sits behind ``AdminSite.admin_view``: login, staff,
CSRF, never cached. Permissions: see ``permissions``.

A project with its own AdminSite registers the pages on it the same way::

    from django_cogworker.admin import register
    register(my_site)
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin

from .. import models
from . import permissions, urls


class PageAdmin(admin.ModelAdmin):
    """A Cogworker page: its URLs are its views; view and change follow the two Cogworker permissions."""

    def get_urls(self) -> list[Any]:
        return urls.page_urls(str(self.opts.model_name), self.admin_site)

    def has_module_permission(self, request: Any) -> bool:
        return permissions.can_view(request.user)

    def has_view_permission(self, request: Any, obj: Any = None) -> bool:
        return permissions.can_view(request.user)

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        # A page with nothing to act on is "View" on the admin index, not "Change".
        return self.model not in models.READ_ONLY_PAGES and permissions.can_change(request.user)

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False


def register(site: admin.AdminSite) -> None:
    for model in models.PAGES:
        site.register(model, PageAdmin)


register(admin.site)
