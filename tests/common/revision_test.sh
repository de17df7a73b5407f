#!/usr/bin/env bash
# revision_test.sh - the revision a build names (common/revision.cmake),
# against git itself in a scratch repository: HEAD's short hash, "-dirty"
# only for a changed tracked file, a new hash after a commit, the header
# left alone when nothing changed, a given revision as given, "unknown"
# outside a checkout; and the CLI of this build names its source tree's
# HEAD (with or without "-dirty"), not a revision from an earlier configure.
#   revision_test.sh SOURCE_DIR TANDEM_CLI
set -uo pipefail
src="$1" cli="$2"
script="$src/common/revision.cmake"
fails=0
check() { # condition message
    if eval "$1"; then echo "ok: $2"; else echo "FAIL: $2"; fails=$((fails + 1)); fi
}
t="$(mktemp -d)"
trap 'rm -rf "$t"' EXIT
rev() { # source [fixed]: the revision the script writes
    cmake -DSRC="$1" -DOUT="$t/revision.h" -DFIXED="${2:-}" -P "$script" || return 1
    sed -nE 's/^#define TANDEM_GIT_REVISION "(.*)"$/\1/p' "$t/revision.h"
}
repo="$t/repo"
mkdir -p "$repo"
git -C "$repo" init -q
git -C "$repo" config user.email t@example.com
git -C "$repo" config user.name t
echo one >"$repo/a.txt"
git -C "$repo" add a.txt
git -C "$repo" commit -qm one
h1="$(git -C "$repo" rev-parse --short=12 HEAD)"
got="$(rev "$repo")"
check '[ "$got" = "$h1" ]' "a clean checkout: HEAD's hash ($got, git says $h1)"
touch -d '2000-01-01' "$t/revision.h"
stamp="$(stat -c %Y "$t/revision.h")"
got="$(rev "$repo")"
check '[ "$(stat -c %Y "$t/revision.h")" = "$stamp" ]' "an unchanged revision leaves the header alone (nothing rebuilds)"
echo untracked >"$repo/new.txt"
got="$(rev "$repo")"
check '[ "$got" = "$h1" ]' "an untracked file is not a change ($got)"
echo two >"$repo/a.txt"
got="$(rev "$repo")"
check '[ "$got" = "$h1-dirty" ]' "a changed tracked file: $h1-dirty ($got)"
check '[ "$(stat -c %Y "$t/revision.h")" != "$stamp" ]' "a new revision rewrites the header"
git -C "$repo" commit -qam two
h2="$(git -C "$repo" rev-parse --short=12 HEAD)"
got="$(rev "$repo")"
check '[ "$got" = "$h2" ] && [ "$h2" != "$h1" ]' "after a commit: the new HEAD ($got, git says $h2)"
got="$(rev "$repo" 0123456789ab)"
check '[ "$got" = "0123456789ab" ]' "a given revision (an image build's) as given ($got)"
mkdir -p "$t/plain"
got="$(GIT_CEILING_DIRECTORIES="$t" rev "$t/plain")"
check '[ "$got" = "unknown" ]' "outside a checkout: unknown ($got)"
# This build's CLI against its own source tree.
if head="$(git -C "$src" rev-parse --short=12 HEAD 2>/dev/null)"; then
    line="$("$cli" version | head -1)"
    check '[[ "$line" == *"(revision $head)" || "$line" == *"(revision $head-dirty)" ]]' \
        "tandem version names the source tree's HEAD $head: $line"
fi
echo "revision: $fails failed"
[ "$fails" -eq 0 ]
