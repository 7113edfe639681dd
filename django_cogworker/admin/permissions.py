"""Who may look at the Cogworker pages, and who may act from them.

Looking needs an active staff user with ``django_cogworker.view_cogworker``;
acting (every POST) needs ``django_cogworker.change_cogworker``, which also
lets one look. Superusers have both. The permissions hang on the Dashboard
model (see ``models``).
"""

from __future__ import annotations

from typing import Any

VIEW = "django_cogworker.view_cogworker"
CHANGE = "django_cogworker.change_cogworker"


def _staff(user: Any) -> bool:
    return bool(user and user.is_active and user.is_staff)


def can_view(user: Any) -> bool:
    return _staff(user) and (user.has_perm(VIEW) or user.has_perm(CHANGE))


def can_change(user: Any) -> bool:
    return _staff(user) and user.has_perm(CHANGE)
