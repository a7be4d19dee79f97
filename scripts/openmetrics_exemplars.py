#!/usr/bin/env python3
"""Reads an OpenMetrics exposition on stdin with the Prometheus Python client's strict
OpenMetrics parser (PyPI `prometheus-client`, installed by scripts/otlp.sh) and prints the
exemplars it carries as JSON: [{"sample", "labels", "trace_id", "value"}]. A parse error
fails with the parser's message: the tracing tests use it to check /metrics in OpenMetrics.
"""

import json
import sys

from prometheus_client.openmetrics.parser import text_string_to_metric_families

found = []
for family in text_string_to_metric_families(sys.stdin.read()):
    for sample in family.samples:
        if sample.exemplar is not None:
            found.append({
                "sample": sample.name,
                "labels": sample.labels,
                "trace_id": sample.exemplar.labels.get("trace_id"),
                "value": sample.exemplar.value,
            })
print(json.dumps(found))
