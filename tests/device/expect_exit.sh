#!/usr/bin/env bash
# expect_exit.sh RC REGEX... -- CMD [ARGS...]: runs CMD, shows its output, and
# succeeds only if it exits with RC and, for each extended regular expression
# REGEX, some line of its output (stdout and stderr together) matches it.
set -u
want="$1"
shift
regexes=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  regexes+=("$1")
  shift
done
[ $# -gt 1 ] || { echo "usage: expect_exit.sh RC REGEX... -- CMD [ARGS...]"; exit 2; }
shift
out="$("$@" 2>&1)"
rc=$?
printf '%s\n' "$out"
if [ "$rc" -ne "$want" ]; then
  echo "expect_exit.sh: exit status $rc, expected $want: $*"
  exit 1
fi
for r in "${regexes[@]}"; do
  if ! printf '%s\n' "$out" | grep -Eq -- "$r"; then
    echo "expect_exit.sh: no line matches: $r"
    exit 1
  fi
done
