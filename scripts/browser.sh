#!/usr/bin/env bash
# Make sure Debian's headless browser for the waiting-page test is installed: `chromium`
# and `chromium-driver` (/usr/bin/chromium, /usr/bin/chromedriver). Installed with apt-get
# when missing (as root, or through sudo when available); idempotent.
#
# Usage: scripts/browser.sh
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive
log() { printf 'browser: %s\n' "$*" >&2; }

if [[ -x /usr/bin/chromium && -x /usr/bin/chromedriver ]]; then
    exit 0
fi
SUDO=()
if [[ $(id -u) -ne 0 ]] && command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
fi
log "apt-get install -y chromium chromium-driver"
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-dejavu-core
/usr/bin/chromium --version >&2
