#!/usr/bin/env bash
# Every process the tools start goes through sandbox_run: no object of libtools.a may call a
# process-starting function itself (git goes through libgit2 in process).
set -euo pipefail
lib="$1"
bad=$(nm -u "$lib" 2>/dev/null | awk '{print $2}' | sed 's/@.*//' |
      grep -xE 'fork|vfork|_Fork|execve|execv|execvp|execvpe|execl|execlp|execle|fexecve|posix_spawn|posix_spawnp|popen|system|clone|clone3|wordexp' || true)
if [ -n "$bad" ]; then
    echo "test_tools_noexec: libtools.a starts processes itself: $bad" >&2
    exit 1
fi
n=$(nm -u "$lib" | grep -c ' U sandbox_run$' || true)
if [ "$n" -lt 1 ]; then
    echo "test_tools_noexec: build/test do not go through sandbox_run" >&2
    exit 1
fi
echo "test_tools_noexec: no process-starting calls in $(basename "$lib"); build/test use sandbox_run"
