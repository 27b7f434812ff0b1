#!/usr/bin/env bash
# `spark-agent sandbox`: exit status is the command's, 125 when the sandbox stopped or refused
# it (reason on stderr), 2 for usage errors; stdout and stderr are the command's.
set -u
cli=${SPARK_CLI:?SPARK_CLI must point at the spark-agent binary}
fails=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
ws=$tmp/ws; mkdir -p "$ws"; cd "$ws" || exit 1
if ! "$cli" sandbox -- true 2>"$tmp/probe"; then
    if grep -q "refused" "$tmp/probe"; then echo "SKIP: $(cat "$tmp/probe")"; exit 77; fi
fi
check() { if [ "$2" = 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }
expect_rc() { # expect_rc NAME WANT CMD...
    local name=$1 want=$2; shift 2
    "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
    [ "$rc" = "$want" ]; check "$name (exit $rc, want $want)" $?
    [ "$rc" = "$want" ] || { echo "  stdout: $(head -c 300 "$tmp/out")"; echo "  stderr: $(head -c 300 "$tmp/err")"; }
}
has() { grep -q -- "$2" "$tmp/$1"; }

expect_rc "help" 0 "$cli" sandbox --help
has out "^usage: spark-agent sandbox"; check "help text" $?
expect_rc "true" 0 "$cli" sandbox -- true
expect_rc "the command's exit status" 3 "$cli" sandbox -- sh -c 'exit 3'
expect_rc "stdout and stderr are the command's" 0 "$cli" sandbox -- sh -c 'echo hi; echo oops >&2'
[ "$(cat "$tmp/out")" = hi ] && [ "$(cat "$tmp/err")" = oops ]; check "streams kept apart" $?
expect_rc "the command's options are not ours" 0 "$cli" sandbox -- ls -la --color=never
expect_rc "timeout: 125" 125 "$cli" sandbox --timeout 0.5 -- sleep 5
has err "stopped by the sandbox: timeout"; check "timeout reason on stderr" $?
expect_rc "killed by a signal: 125" 125 "$cli" sandbox -- sh -c 'kill -KILL $$'
has err "stopped by the sandbox: signal"; check "signal reason on stderr" $?
expect_rc "read-only policy: the write fails" 1 "$cli" sandbox --policy read-only -- touch made
[ ! -e made ]; check "read-only policy: nothing written" $?
expect_rc "workspace-write: the write works" 0 "$cli" sandbox -- touch made
[ -e made ]; check "workspace-write: file on the host" $?
expect_rc "no network by default" 0 "$cli" sandbox -- sh -c 'test ! -e /sys/class/net && cat /proc/net/dev | grep -c ":" | grep -qx 1'
expect_rc "file-size limit: 125" 125 "$cli" sandbox --file-size 64K -- dd if=/dev/zero of=big bs=4096 count=100
has err "file-size"; check "file-size reason" $?
expect_rc "output cap" 0 "$cli" sandbox --output-cap 1K -- sh -c 'seq 1 10000'
has err "output truncated"; check "truncation reported" $?
has out "omitted by the sandbox"; check "truncation marked in the output" $?
expect_rc "unsandboxed runs, with a warning" 0 "$cli" sandbox --unsandboxed -- true
has err "WARNING: running UNSANDBOXED"; check "unsandboxed warning" $?
expect_rc "verbose" 0 "$cli" sandbox -v -- true
has err "isolated (pooled network namespace), landlock ABI"; check "verbose summary: pooled by default, as the tools" $?
expect_rc "verbose, with the network" 0 "$cli" sandbox -v --network -- true
has err "isolated, landlock ABI"; check "verbose summary: the network is the host's, nothing pooled" $?
expect_rc "no command: usage" 2 "$cli" sandbox
expect_rc "bad policy: usage" 2 "$cli" sandbox --policy everything -- true
expect_rc "bad memory: usage" 2 "$cli" sandbox --memory lots -- true
expect_rc "missing command: 127" 127 "$cli" sandbox -- no-such-command-spark
mkdir -p "$tmp/other"
touch "$tmp/host-file"
expect_rc "a read-only tree that contains the staging directory (/tmp)" 0 "$cli" sandbox --ro /tmp -- test -e "$tmp/host-file"
mkdir -p "$tmp/repo/.git" "$tmp/repo/sub"
(cd "$tmp/repo/sub" && "$cli" sandbox -- sh -c 'touch ../from-sub && pwd') >"$tmp/out" 2>"$tmp/err"
[ -e "$tmp/repo/from-sub" ] && [ "$(cat "$tmp/out")" = "$tmp/repo/sub" ]
check "inside a repository the workspace is its root, the directory the current one" $?
expect_rc "directory outside the workspace: usage" 2 "$cli" sandbox --workspace "$tmp/other" -- true
# Fail closed: in a user namespace that may not create more, the sandbox refuses (125), naming
# what is missing; with `sandbox = off` in the config it runs unsandboxed and says so.
if unshare -U -r true 2>/dev/null; then
    mkdir -p "$tmp/cfg/spark-agent"
    nouserns() { XDG_CONFIG_HOME="$tmp/cfg" unshare -U -r sh -c 'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"' sh "$@"; }
    expect_rc "no user namespaces: refused" 125 nouserns "$cli" sandbox -- true
    has err "refused: .*user namespaces refused"; check "the refusal names user namespaces" $?
    echo "sandbox = off" > "$tmp/cfg/spark-agent/config"
    expect_rc "no user namespaces, sandbox = off: runs" 0 nouserns "$cli" sandbox -- true
    has err "WARNING: running UNSANDBOXED (sandbox = off"; check "sandbox = off warns" $?
else
    echo "note: unshare -U unavailable: the fail-closed CLI checks are covered by test_sandbox_run only"
fi
echo "$fails failure(s)"
[ "$fails" = 0 ]
