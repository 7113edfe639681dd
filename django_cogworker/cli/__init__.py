"""``manage.py cogworker``: the operator's command line (``management/commands/cogworker.py`` is
its edge; ``listings`` reads, ``actions`` writes, ``output`` prints), all through ``api``."""
