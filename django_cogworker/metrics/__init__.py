"""Prometheus metrics: ``metrics_view`` (``views``), what a scrape reads (``collect``) and the
text format (``exposition``). See docs/metrics.md."""

from .views import metrics_view

__all__ = ["metrics_view"]
