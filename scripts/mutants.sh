#!/usr/bin/env bash
# A mutation pass (cargo-mutants) over the room's pure and stateful cores: the queue's rules, the
# local line, the held polls, the spent-token memory, the canonical path and protection decision,
# and the HTTP/1 splitters and framing decision the connection loop and the early answers obey.
# Each mutant is one small change to the code (a `<` turned `<=`, a function returning a
# default); a test suite that still passes with it in place does not check that line.
#
#   scripts/mutants.sh                      # every core file below
#   scripts/mutants.sh src/rules/wait.rs    # only these files
#   MUTANTS_JOBS=2 scripts/mutants.sh       # parallel builds (each needs its own copy of target/)
#
# The tests built and run per mutant are the ones that need no Redis and no network, so a mutant
# takes one incremental build and a few seconds of tests: the library's unit tests, plus the property tests
# that cover the file (tests/rules_props.rs for the queue's arithmetic and the address rules,
# tests/path_props.rs for paths, tests/http1_props.rs for the head and chunk splitters). The early
# answers (src/proxy/early.rs) are checked by tests/early_answers.rs, which starts Redis and two
# proxies per test: a group of its own, run only when named (`scripts/mutants.sh src/proxy/early.rs`),
# as each of its mutants costs a build and half a minute of tests. Files are grouped by the tests they need, so a file checked by
# unit tests alone builds one test binary per mutant, not three. A mutant these miss may still be
# caught by the integration tests; the summary says which mutants to look at, not that the suite
# misses them.
#
# Builds share target/mutants-build across groups and runs (cargo-mutants builds a copy of the
# tree; without a kept target directory every run would first rebuild every dependency).
# Results land in target/mutants/<group>/mutants.out (caught.txt, missed.txt, unviable.txt,
# timeout.txt); each group ends with cargo-mutants' own summary line. Installs cargo-mutants when
# it is missing.
set -euo pipefail

cd "$(dirname "$0")/.."
if ! cargo mutants --version >/dev/null 2>&1; then
  echo "==> installing cargo-mutants" >&2
  cargo install --locked cargo-mutants
fi

files=("$@")
if [ ${#files[@]} -eq 0 ]; then
  files=(src/room/spent.rs src/rules/address.rs src/rules/token.rs src/rules/wait.rs src/room/held.rs
    src/room/line.rs src/rules/adaptive.rs src/paths/mod.rs src/paths/canonical.rs src/paths/rules.rs
    src/http1/head.rs src/http1/chunked.rs)
fi

# The tests a file's mutants are checked against.
group_of() {
  case "$1" in
    src/paths/*) echo paths ;;
    src/http1/*) echo http1 ;;
    src/proxy/early.rs) echo early ;;
    src/rules/wait.rs | src/rules/address.rs | src/rules/token.rs) echo rules ;;
    *) echo unit ;;
  esac
}
# As cargo-mutants' --cargo-test-arg, so that they also limit its build step (`cargo test
# --no-run`): after `--` they would only reach the test run, and every mutant would first link
# all thirty-odd integration test binaries.
tests_of() {
  case "$1" in
    paths) echo "--cargo-test-arg=--lib --cargo-test-arg=--test=path_props" ;;
    http1) echo "--cargo-test-arg=--lib --cargo-test-arg=--test=http1_props" ;;
    early) echo "--cargo-test-arg=--test=early_answers" ;;
    rules) echo "--cargo-test-arg=--lib --cargo-test-arg=--test=rules_props" ;;
    unit) echo "--cargo-test-arg=--lib" ;;
  esac
}

export CARGO_TARGET_DIR=$PWD/target/mutants-build
status=0
for group in unit rules paths http1 early; do
  globs=()
  for f in "${files[@]}"; do
    [ "$(group_of "$f")" = "$group" ] && globs+=(--file "$f")
  done
  [ ${#globs[@]} -eq 0 ] && continue
  mkdir -p "target/mutants/$group"
  read -r -a tests <<<"$(tests_of "$group")"
  echo "==> $group: ${globs[*]} (${tests[*]})" >&2
  # Debug info off: most of a mutant's time is the incremental build and link.
  CARGO_PROFILE_DEV_DEBUG=0 CARGO_PROFILE_TEST_DEBUG=0 \
    cargo mutants --package waitroom "${globs[@]}" "${tests[@]}" --jobs "${MUTANTS_JOBS:-1}" \
    --no-shuffle --output "target/mutants/$group" --timeout-multiplier 3 --minimum-test-timeout 30 \
    || status=$?
done
# cargo-mutants exits 2 when mutants were missed, 3 on timeouts: the summaries say which.
exit "$status"
