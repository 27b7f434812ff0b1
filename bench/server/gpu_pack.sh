#!/bin/sh
# Pack a spark-agent build for the GPU machine (bench/server/gpu_run.sh): the binary (stripped),
# every shared library ldd names, and this system's loader and libc family (the other machine's
# glibc may be older), as .srvgpu/pkg.tar.xz (.srvgpu/ is git-ignored via .git/info/exclude).
#   sh bench/server/gpu_pack.sh BUILD/spark-agent
bin=${1:?path to spark-agent}
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
mkdir -p "$tmp/lib" "$root/.srvgpu"
strip -o "$tmp/spark-agent" "$bin" || exit 1
ldd "$bin" | awk '/=> \//{print $3} /^\t\/lib/{print $1}' | while read -r f; do
    cp -L "$f" "$tmp/lib/"
done
for f in libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libresolv.so.2; do
    cp -L "/lib/x86_64-linux-gnu/$f" "$tmp/lib/" 2>/dev/null
done
cp -L /lib64/ld-linux-x86-64.so.2 "$tmp/lib/"
tar -cJf "$root/.srvgpu/pkg.tar.xz" -C "$tmp" . && rm -rf "$tmp"
ls -la "$root/.srvgpu/pkg.tar.xz"
