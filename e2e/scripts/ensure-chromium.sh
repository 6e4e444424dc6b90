#!/bin/sh
# The browser tests drive Debian's Chromium: Playwright's own browser download needs hosts this machine cannot
# reach. Installed here, on first use, so the README's one test command works on a fresh machine.
set -e
if [ -x /usr/bin/chromium ]; then exit 0; fi
echo "Chromium is missing: installing Debian's chromium package for the browser tests"
if [ "$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
  echo "cannot install chromium: not root and no sudo; install it with: apt-get install chromium" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq chromium >/dev/null
/usr/bin/chromium --version
