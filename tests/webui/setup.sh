#!/usr/bin/env bash
# What the Web UI browser test needs, installed on first use: Debian's Chromium (apt) and
# playwright-core (npm, pinned by package-lock.json, into tests/webui/node_modules).
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ]; then sudo=(); elif command -v sudo >/dev/null; then sudo=(sudo -n); else
    echo "setup.sh: /usr/bin/chromium is missing and installing it needs root (apt-get install chromium)" >&2
    exit 1
  fi
  echo "setup.sh: installing Debian's chromium and chromium-driver" >&2
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends chromium chromium-driver >&2
fi
if [ ! -f node_modules/playwright-core/package.json ]; then
  npm ci --no-audit --no-fund --loglevel=error >&2
fi
