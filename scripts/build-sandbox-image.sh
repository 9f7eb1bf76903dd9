#!/usr/bin/env bash
# Build the sandbox image offline (debootstrap + docker import), reusing it when present.
# Usage: scripts/build-sandbox-image.sh [--force]
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v debootstrap >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update && apt-get install -y --no-install-recommends debootstrap
fi
exec python -m tools_sandbox.cli build-image "$@"
