#!/usr/bin/env bash
# Installs what the tracing tests' OTLP receiver (scripts/otlp_receiver.py) decodes with:
# the OpenTelemetry protobuf definitions from PyPI, pinned.
set -euo pipefail

if python3 -c 'import opentelemetry.proto.collector.trace.v1.trace_service_pb2' 2>/dev/null; then
    exit 0
fi
printf 'otlp: python3 -m pip install opentelemetry-proto==1.27.0\n' >&2
python3 -m pip install --quiet 'opentelemetry-proto==1.27.0'
