#!/usr/bin/env bash
# The inbox test drives Debian's headless Chromium through Debian's chromedriver (no browser
# download is possible on CI). Installs both when missing; needs root (CI runs as root).
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-dejavu-core >/dev/null
chromium --version
