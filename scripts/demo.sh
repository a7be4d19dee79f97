#!/usr/bin/env bash
# Start local PostgreSQL and Redis if needed, build flashgate in release mode and serve
# a demo sale. Extra arguments go to `flashgate demo` (for example --config file.toml).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/services.sh
exec cargo run --release -- demo "$@"
