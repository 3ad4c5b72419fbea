#!/usr/bin/env bash
# Install Debian's `chromium`, the headless browser the web UI's tests (tests/test_ui_browser.py) drive
# through Playwright for Python, if it is missing. Idempotent. Playwright's own browser download is never
# used (`playwright install` is not run): the tests launch /usr/bin/chromium. Without it those tests skip
# with a message naming this script.
set -euo pipefail
say() { echo "browser-deps: $*" >&2; }
if command -v chromium >/dev/null; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    say "chromium is missing and this user cannot apt-get install it: the browser tests will skip"
    exit 0
fi
DEBIAN_FRONTEND=noninteractive apt-get update -qq </dev/null >&2 || say "apt-get update failed"
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core </dev/null >&2
say "installed $(chromium --version 2>/dev/null || echo chromium)"
