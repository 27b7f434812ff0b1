#!/bin/sh
# The extension packages into a .vsix offline with its locked dependencies
# (scripts/install-deps.sh runs `npm ci --ignore-scripts` in editor-plugins/vscode), and the
# package holds what the extension needs at run time and nothing of the build tooling.
set -eu
ext="$SPARK_SOURCE_DIR/editor-plugins/vscode"
if ! command -v node >/dev/null 2>&1; then
    echo "SKIP: node is not installed"; exit 77
fi
if [ ! -x "$ext/node_modules/.bin/vsce" ]; then
    echo "SKIP: @vscode/vsce is not installed in $ext (run scripts/install-deps.sh)"; exit 77
fi
out="${SPARK_BINARY_DIR:-/tmp}/editor-plugins"
mkdir -p "$out"
rm -f "$out/spark-agent.vsix"
(cd "$ext" && ./node_modules/.bin/vsce package --no-update-package-json \
    -o "$out/spark-agent.vsix")
list=$(node -e '
const fs = require("fs"), zlib = require("zlib");
const b = fs.readFileSync(process.argv[1]);
// walk the zip central directory: the names of the entries
let eocd = b.lastIndexOf(Buffer.from([0x50, 0x4b, 0x05, 0x06]));
let n = b.readUInt16LE(eocd + 10), off = b.readUInt32LE(eocd + 16), names = [];
for (let i = 0; i < n; i++) {
  const len = b.readUInt16LE(off + 28), extra = b.readUInt16LE(off + 30), com = b.readUInt16LE(off + 32);
  names.push(b.slice(off + 46, off + 46 + len).toString()); off += 46 + len + extra + com;
}
console.log(names.join("\n"));' "$out/spark-agent.vsix")
for f in extension/package.json extension/src/extension.js extension/src/rpc.js \
         extension/media/chat.js extension/node_modules/ws/index.js extension.vsixmanifest; do
    echo "$list" | grep -qx "$f" || { echo "FAIL: $f missing from the .vsix"; exit 1; }
done
if echo "$list" | grep -q '^extension/node_modules/@vscode/'; then
    echo "FAIL: build tooling (@vscode/vsce) was packaged"; exit 1
fi
echo "ok: $out/spark-agent.vsix ($(echo "$list" | wc -l) entries)"
