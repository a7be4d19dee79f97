#!/usr/bin/env bash
# Installs what the edge Worker's tests run: Node.js and npm (Debian packages, when missing)
# and, with `npm ci`, the workerd runtime pinned in edge/cloudflare/package-lock.json.
# tests/api/edge_worker.rs starts edge/cloudflare/node_modules/.bin/workerd.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf 'edge: %s\n' "$*" >&2; }

if ! command -v npm >/dev/null 2>&1; then
    SUDO=""
    [[ $(id -u) -eq 0 ]] || SUDO="sudo"
    log "apt-get install nodejs npm"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi

log "npm ci in edge/cloudflare (workerd $(sed -n 's/.*"workerd": "\(.*\)".*/\1/p' edge/cloudflare/package.json))"
(cd edge/cloudflare && npm ci --no-audit --no-fund --loglevel=error)
edge/cloudflare/node_modules/.bin/workerd --version >&2
