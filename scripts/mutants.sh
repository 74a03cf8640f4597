#!/usr/bin/env bash
# A mutation pass (cargo-mutants) over the room's pure and stateful cores: the queue's rules, the
# local line, the spent-token memory, the canonical path and protection decision. Each mutant is
# one small change to the code (a `<` turned `<=`, a function returning a default); a test suite
# that still passes with it in place does not check that line.
#
#   scripts/mutants.sh                      # every core file below
#   scripts/mutants.sh src/rules/wait.rs    # only these files
#   MUTANTS_JOBS=2 scripts/mutants.sh       # parallel builds (each needs its own copy of target/)
#
# The tests run per mutant are the ones that need no Redis and no network, so a mutant takes one
# incremental build and a few seconds of tests: the library's unit tests and the property tests
# (tests/rules_props.rs, tests/path_props.rs). A mutant those miss may still be caught by the
# integration tests; the summary says which mutants to look at, not that the suite misses them.
#
# Results land in target/mutants/mutants.out (caught.txt, missed.txt, unviable.txt, timeout.txt);
# the last lines are cargo-mutants' own summary. Installs cargo-mutants when it is missing.
set -euo pipefail

cd "$(dirname "$0")/.."
if ! cargo mutants --version >/dev/null 2>&1; then
  echo "==> installing cargo-mutants" >&2
  cargo install --locked cargo-mutants
fi

files=("$@")
if [ ${#files[@]} -eq 0 ]; then
  files=(src/rules/wait.rs src/rules/token.rs src/rules/address.rs src/rules/adaptive.rs
    src/line.rs src/spent.rs src/paths.rs)
fi
globs=()
for f in "${files[@]}"; do globs+=(--file "$f"); done

mkdir -p target/mutants
# Debug info off: most of a mutant's time is the incremental build and link.
CARGO_PROFILE_DEV_DEBUG=0 CARGO_PROFILE_TEST_DEBUG=0 \
  cargo mutants --package waitroom "${globs[@]}" --jobs "${MUTANTS_JOBS:-1}" \
  --output target/mutants --timeout-multiplier 3 --minimum-test-timeout 30 \
  -- --lib --test rules_props --test path_props
