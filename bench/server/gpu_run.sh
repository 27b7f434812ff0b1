#!/bin/sh
# The server figures on the GPU machine, in one go (bench/server/README.md): that machine has
# none of our Debian libraries, so a release build made here travels with its shared libraries
# and Debian's own loader and libc (bench/server/gpu_pack.sh packs them into .srvgpu/).
#   sh bench/server/gpu_run.sh OUTDIR [PRESET] [TYPE] [TOKENS] [CLIENTS]
# Every step has its own timeout; logs under OUTDIR.
out=${1:?OUTDIR}
preset=${2:-qwen3-30b-a3b}
type=${3:-q4_k_m}
tokens=${4:-32}
clients=${5:-1,8,32}
here=$(cd "$(dirname "$0")/../.." && pwd)
# the whole run ends by this many seconds (the device call's limit minus a margin)
end=$(( $(date +%s) + ${BUDGET_S:-165} ))
left() { echo $(( end - $(date +%s) )); }
pk=$here/.srvgpu
mkdir -p "$out"
{
    echo "== machine"; ldd --version 2>&1 | head -1; cat /etc/os-release 2>/dev/null | head -2
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
    nproc
} >"$out/machine.txt" 2>&1
cat "$out/machine.txt"
rm -rf /tmp/srvgpu && mkdir -p /tmp/srvgpu && tar -xJf "$pk/pkg.tar.xz" -C /tmp/srvgpu || exit 1
L=/tmp/srvgpu/lib
t0=$(date +%s)
timeout $(( $(left) - 30 )) "$L/ld-linux-x86-64.so.2" --library-path "$L" /tmp/srvgpu/spark-agent model gen \
    --preset "$preset" --type "$type" -s 1 -o /tmp/m.gguf >"$out/gen.log" 2>&1
echo "gen rc=$? in $(( $(date +%s) - t0 )) s"; tail -3 "$out/gen.log"; ls -la /tmp/m.gguf
token=bench-token-0123456789-$$
export SPARK_API_KEY=$token XDG_CONFIG_HOME=/tmp/srvgpu/cfg
t0=$(date +%s)
"$L/ld-linux-x86-64.so.2" --library-path "$L" /tmp/srvgpu/spark-agent serve -m /tmp/m.gguf \
    --device "${DEVICE:-cuda}" --port 18088 --ctx 2048 --max-seqs 32 --max-conns 200 \
    >"$out/serve.out" 2>"$out/serve.err" &
spid=$!
i=0
while [ $i -lt 240 ] && [ "$(left)" -gt 15 ] && ! grep -q "listening on" "$out/serve.out" 2>/dev/null; do
    kill -0 $spid 2>/dev/null || break
    sleep 0.5; i=$((i + 1))
done
echo "serve up after $(( $(date +%s) - t0 )) s:"; cat "$out/serve.out"; tail -5 "$out/serve.err"
if grep -q "listening on" "$out/serve.out"; then
    timeout $(( $(left) - 8 )) python3 -u "$here/bench/server/bench_serve.py" --url http://127.0.0.1:18088 \
        --token "$token" --tokens "$tokens" --requests 1 --clients "$clients" --timeout 100 \
        2>&1 | tee "$out/bench.txt"
    timeout 5 python3 - "$token" >"$out/metrics.txt" 2>&1 <<'EOF'
import sys, urllib.request
r = urllib.request.Request('http://127.0.0.1:18088/metrics',
                           headers={'authorization': 'Bearer ' + sys.argv[1]})
print(urllib.request.urlopen(r, timeout=4).read().decode())
EOF
fi
kill -TERM $spid 2>/dev/null
sleep 2
kill -KILL $spid 2>/dev/null
tail -20 "$out/serve.err"
