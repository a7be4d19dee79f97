#!/usr/bin/env bash
# The OpenID Connect provider the provider-token tests start (tests/oidc/provider.mjs, the
# oidc-provider package from npm): Node.js and npm from Debian when missing (as root, or
# through sudo), then `npm ci` from the committed lockfile. Idempotent.
#
# Usage: scripts/oidc.sh [--no-system]   (--no-system: install nothing outside the repository)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export DEBIAN_FRONTEND=noninteractive
log() { printf 'oidc: %s\n' "$*" >&2; }

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    if [[ ${1:-} == --no-system ]]; then
        log "node and npm are missing; the oidc tests cannot run"
        exit 1
    fi
    SUDO=()
    if [[ $(id -u) -ne 0 ]] && command -v sudo >/dev/null 2>&1; then
        SUDO=(sudo)
    fi
    log "apt-get install -y nodejs npm"
    "${SUDO[@]}" apt-get update -qq
    "${SUDO[@]}" apt-get install -y -qq --no-install-recommends nodejs npm
fi
log "node $(node --version), npm $(npm --version)"
if [[ tests/oidc/package-lock.json -nt tests/oidc/node_modules/.package-lock.json ]]; then
    (cd tests/oidc && npm ci --no-audit --no-fund --loglevel=error)
fi
