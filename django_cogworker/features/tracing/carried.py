"""What a payload carries of a trace, named once and readable without OpenTelemetry.

The tracing feature writes and reads these (spans.py); the batches feature keeps its members'
traceparents for its callbacks' links (features/batches/steps.py, and its scripts, which get
LINKS_MAX and TRACEPARENT_LENGTH formatted in). This module imports nothing of OpenTelemetry, so a
batch step reads a job's trace context with tracing off or the API not installed.
"""

from __future__ import annotations

import re

# The payload field holding a push's trace context: the W3C headers the configured propagator
# writes ({"traceparent": ..., "tracestate": ..., "baggage": ...}), outside an encrypted job's seal
# (a trace context is not secret, and a worker reads it before it opens anything).
FIELD = "trace"
# The payload field of a batch's callback naming its members' traces: their traceparents, space-
# separated, collected by the members' batch steps in the scripts they already run and spliced in
# as the callback fires (features/batches/scripts.py).
LINKS_FIELD = "trace_links"
# Members' traces a batch callback links to, at most (OpenTelemetry's SDK keeps 128 links a span):
# what the batch scripts keep, what a step sends them and what a callback's span reads back.
LINKS_MAX = 32
# A W3C traceparent, version 00 (trace id, parent span id, flags): the only shape a batch keeps for
# its callbacks' links, TRACEPARENT_LENGTH characters with no space (its scripts count and split on that).
TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
TRACEPARENT_LENGTH = 55
