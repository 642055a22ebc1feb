#!/usr/bin/env bash
# Install what the tests need, start the services they use, then run them:
# `bash tests/run.sh [pytest args]`.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# System tools: git and bubblewrap (capture, sandboxes), podman and runc (the Docker sandbox's tests
# start podman's Docker API on a socket of their own) with busybox-static (their base image),
# redis-server (each service test starts its own on a free port), PostgreSQL (the service's records;
# started below when it is not running), Chromium (the dashboard's browser tests, driven by Playwright).
missing=()
command -v git >/dev/null || missing+=(git)
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || missing+=(runc)
command -v busybox >/dev/null || missing+=(busybox-static)
command -v redis-server >/dev/null || missing+=(redis-server)
command -v psql >/dev/null || missing+=(postgresql postgresql-client)
command -v chromium >/dev/null || missing+=(chromium)
if [ ${#missing[@]} -gt 0 ]; then
    if command -v apt-get >/dev/null; then
        as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
        echo "please install: ${missing[*]}" >&2
        exit 1
    fi
fi

# PostgreSQL: use the server on 127.0.0.1:5432 when it answers, else start the local cluster and
# connect through its socket as a superuser role named after this user.
pg_ok() { psql "$1" -Atqc 'select 1' >/dev/null 2>&1; }
if [ -z "${FLAKETRIAGE_TEST_POSTGRES:-}" ]; then
    tcp="postgresql://postgres@127.0.0.1:5432/postgres"
    sock="postgresql:///postgres?host=/var/run/postgresql"
    if ! pg_ok "$tcp" && ! pg_ok "$sock"; then
        version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -1)
        if [ -n "$version" ]; then
            as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start 2>/dev/null || true
            for _ in $(seq 30); do pg_isready -q && break; sleep 1; done
            as_root su postgres -c "createuser -s $(id -un)" 2>/dev/null || true
        fi
    fi
    if pg_ok "$tcp"; then export FLAKETRIAGE_TEST_POSTGRES="$tcp"
    elif pg_ok "$sock"; then export FLAKETRIAGE_TEST_POSTGRES="$sock"
    else echo "PostgreSQL is not reachable; set FLAKETRIAGE_TEST_POSTGRES to an admin URL" >&2; exit 1
    fi
fi

python3 -m venv .venv
. .venv/bin/activate
# torch from the pinned CPU build first (any other torch spec downloads gigabytes).
python -c "import torch" 2>/dev/null || pip install -q --disable-pip-version-check torch==2.13.0
pip install -q --disable-pip-version-check -e '.[dev,demo,guards,lightning,huggingface,sentry,server,s3,github,docker]'
# One worker process per core and one more, at most four (each starts its own services as its tests
# need them): a third of a worker's time is spent waiting on the programs, services and sandboxes its
# tests run, which another worker's tests fill.
workers=$(( $(nproc) + 1 ))
[ "$workers" -gt 4 ] && workers=4
python -m pytest -n "$workers" "$@"
