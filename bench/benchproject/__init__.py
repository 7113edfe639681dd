"""The Django project the benchmark's cogworker processes run: minimal settings and one no-op job."""
