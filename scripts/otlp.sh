#!/usr/bin/env bash
# Installs what the tracing tests check with, from PyPI, pinned: the OpenTelemetry protobuf
# definitions their OTLP receiver decodes with (scripts/otlp_receiver.py), and the
# Prometheus client whose OpenMetrics parser reads /metrics (scripts/openmetrics_exemplars.py).
set -euo pipefail

packages=('opentelemetry-proto==1.27.0' 'prometheus-client==0.21.1')
if python3 -c 'import opentelemetry.proto.collector.trace.v1.trace_service_pb2, prometheus_client.openmetrics.parser' 2>/dev/null; then
    exit 0
fi
printf 'otlp: python3 -m pip install %s\n' "${packages[*]}" >&2
python3 -m pip install --quiet "${packages[@]}"
