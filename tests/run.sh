#!/usr/bin/env bash
# Install what the tests need, then run them: `bash tests/run.sh [pytest args]`.
set -euo pipefail
cd "$(dirname "$0")/.."

# System tools the sandbox and source-capture tests use.
missing=()
command -v git >/dev/null || missing+=(git)
command -v bwrap >/dev/null || missing+=(bubblewrap)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null
    else
        echo "please install: ${missing[*]}" >&2
        exit 1
    fi
fi

python3 -m venv .venv
. .venv/bin/activate
pip install -q --disable-pip-version-check -e '.[dev,demo]'
python -m pytest "$@"
