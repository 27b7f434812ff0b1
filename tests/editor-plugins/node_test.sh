#!/bin/sh
# Run node test files with node's built-in runner; skip (77) only when node itself is missing.
if ! command -v node >/dev/null 2>&1; then
    echo "SKIP: node is not installed (scripts/install-deps.sh installs it)"
    exit 77
fi
# run the file itself (not `node --test`): its exit status then carries a whole-file skip (77)
exec node "$@"
