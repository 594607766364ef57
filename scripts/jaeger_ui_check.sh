#!/usr/bin/env bash
# Look at a faultlab trace export in the real Jaeger UI (v2.19.0, built from its source) and
# check what a person sees there; screenshots go beside the export.
#
#     scripts/jaeger_ui_check.sh EXPORT.json [--trace ID] [--out PNG] [--detail-out PNG]
#     scripts/jaeger_ui_check.sh --setup-only          (build and install, check nothing)
#
# EXPORT.json comes from `faultlab trace export RUN_DIR --format jaeger --out EXPORT.json`.
# Steps, each printed as it starts and skipped when already done:
#   1. tools: node and npm (Debian's nodejs/npm) and Debian's chromium; installed with
#      apt-get when missing and we are root, else one line naming what is missing
#   2. Jaeger UI: tag v2.19.0 of the public repository jaegertracing/jaeger-ui, checked out
#      from a local git copy ($JAEGER_UI_SRC: a clone or mirror of it) into
#      $CACHE/jaeger-ui, then `npm ci` and `npm run build` (its package.json asks for
#      Node >= 24; 2.19.0 builds with Node 20, so the engine check is relaxed)
#   3. playwright-core (npm, pinned) into $CACHE/jaeger-ui-driver; it drives the Debian
#      chromium, no browser download
#   4. scripts/jaeger_ui_check.py: serves the build on loopback, uploads the export through
#      the UI's Search → Upload page, opens the failed trace, checks and screenshots it
# $CACHE is $FAULTLAB_JAEGER_UI_CACHE, default ~/.cache/faultlab (outside the repo).
# Measured here: npm ci 57 s (687 packages), build 24 s, a check 20-25 s.
# Exit: 0 all checks passed (or skipped), 1 a check failed, 2 bad input or a missing tool.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${FAULTLAB_JAEGER_UI_CACHE:-$HOME/.cache/faultlab}
export FAULTLAB_JAEGER_UI_CACHE=$CACHE
TAG=v2.19.0
PLAYWRIGHT_PIN=playwright-core@1.65.1
SRC=${JAEGER_UI_SRC:-/work/.mirror/jaegertracing+jaeger-ui/repo}
UI=$CACHE/jaeger-ui
BUILD_STAMP=$UI/.faultlab-built-$TAG
DRIVER_DIR=$CACHE/jaeger-ui-driver

say() { echo "[jaeger-ui] $*" >&2; }
die() { echo "jaeger_ui_check: $*" >&2; exit 2; }

ensure_tools() {
    local missing=()
    command -v node >/dev/null && command -v npm >/dev/null || missing+=(nodejs npm)
    command -v chromium >/dev/null || missing+=(chromium)
    [[ ${#missing[@]} -eq 0 ]] && return
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
        die "missing: ${missing[*]} (install the Debian packages: apt-get install ${missing[*]})"
    fi
    say "1. installing ${missing[*]} from Debian (apt-get)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null \
        || die "apt-get install ${missing[*]} failed"
}

build_ui() {
    [[ -f $BUILD_STAMP && -f $UI/packages/jaeger-ui/build/index.html ]] && return
    git -C "$SRC" rev-parse -q --verify "$TAG^{commit}" >/dev/null 2>&1 \
        || die "no git copy of jaegertracing/jaeger-ui with tag $TAG at $SRC (set JAEGER_UI_SRC)"
    say "2. Jaeger UI $TAG: checkout into $UI"
    rm -rf "$UI"
    git clone -q --no-checkout "$SRC" "$UI"
    git -C "$UI" -c advice.detachedHead=false checkout -q "$TAG"
    local t0=$SECONDS
    (cd "$UI" && npm ci --no-audit --no-fund --engine-strict=false --loglevel=error >/dev/null) \
        || die "npm ci failed in $UI"
    say "   npm ci: $((SECONDS - t0)) s"; t0=$SECONDS
    (cd "$UI" && npm run build >/dev/null 2>&1) || die "npm run build failed in $UI (rerun it there to see why)"
    say "   npm run build: $((SECONDS - t0)) s"
    touch "$BUILD_STAMP"
}

install_driver() {
    [[ -f $DRIVER_DIR/node_modules/playwright-core/package.json ]] && return
    say "3. $PLAYWRIGHT_PIN into $DRIVER_DIR"
    mkdir -p "$DRIVER_DIR"
    npm install --prefix "$DRIVER_DIR" --no-audit --no-fund --no-save --loglevel=error "$PLAYWRIGHT_PIN" >/dev/null \
        || die "npm install $PLAYWRIGHT_PIN failed"
}

ensure_tools
build_ui
install_driver
[[ ${1:-} == --setup-only ]] && { say "ready: $UI/packages/jaeger-ui/build"; exit 0; }
PY=$ROOT/.venv/bin/python
[[ -x $PY ]] || PY=python3
exec "$PY" "$ROOT/scripts/jaeger_ui_check.py" "$@"
