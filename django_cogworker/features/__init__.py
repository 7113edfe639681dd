"""The features, one folder each: what a job can do beyond being pushed, run and settled.

    batches       Batch, and chain, group, chord on it: a job's batch step, delivered callbacks
    limits        Limiter: concurrency, bucket, window and leaky limits across the fleet, and the
                  heartbeat's upkeep of their leases
    cancellation  cancel(jid): a request, then the job taken off where it waits or stopped running
    results       a job's result record (``result:<jid>``) and get_result
    expiry        a job dropped unrun past its ``expires_in`` (its hook comes with the core's phases)

A folder holds the whole of its feature: its Lua (``scripts.py``), its object model for the admin
and the CLI (``api.py``, re-exported by ``django_cogworker.api``), its admin views
(``admin_views.py``, routed by admin/urls.py), its metrics (``metrics.py``, read by
metrics/collect.py), and the worker's side of it. Its templates are the one part elsewhere:
Django finds an app's templates in its ``templates/`` folder only, so they are in
``templates/admin/cogworker/<feature>/``.

Features depend on the core (broker/, push/, engine/, api/'s general parts); the core depends on no
feature, and broker/ on nothing above it (tests/test_layout.py holds the rule, and the list of the
core's imports of features that remain until the worker's per-job path calls features through its
hooks). A feature may use another (cancellation reads a batch's hand-over jobs); the Django side
(admin/, metrics/, cli/, checks.py, the root package) gathers them.
"""
