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
# torch from the pinned CPU build first (any other torch spec downloads gigabytes).
python -c "import torch" 2>/dev/null || pip install -q --disable-pip-version-check torch==2.13.0
pip install -q --disable-pip-version-check -e '.[dev,demo,guards,lightning,huggingface,sentry]'
python -m pytest "$@"
