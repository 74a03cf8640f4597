#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (.ci/run calls this after printing versions):
#
#   1. installs what the tests need when it is missing (apt-get; sudo only when not root):
#      cmake (pingora builds zlib-ng with it), redis-server and redis-cli (every integration test
#      starts its own redis-server on a free port), curl (the README's walkthrough, which
#      tests/readme.rs runs), promtool (checks the /metrics exposition and
#      the alert rules), node, npm and chromium (the waiting page's tests), and in a venv under
#      target/ the pinned Python tools that check the API description, docs/openapi.yaml, and
#      the configurations against docs/proxy.schema.json (docs/requirements-api.txt:
#      openapi-spec-validator, schemathesis, check-jsonschema);
#   2. builds the binaries (the proxy's, and the demo order API, the identity front and the crowd
#      of tools/, which the integration tests start) and runs `waitroom --check` on every
#      configuration shipped in the repository (proxy.yaml, examples/**/*.yaml), so an example can
#      never drift from the code. Each is checked as it stands, with no environment prepared for
#      it: the JWT example verifies with a public key shipped in examples/keys/ rather than an
#      HS256 secret from a variable, so no dummy secret is needed;
#   3. runs `cargo test`: unit tests and the integration tests under tests/ and tools/tests/.
#
# Arguments go to `cargo test`, e.g. `scripts/test.sh --test endpoints` runs one test file.
#
# Plain `cargo build` and `cargo test`, not `--workspace`: they cover the workspace's default
# members, the proxy and tools/, and leave out bench/, whose chart library the tests do not need
# (see Cargo.toml). The binaries are built first because a test of the proxy finds the demo order
# API in the target directory (tests/common/demo_api.rs), and `cargo test --test X` builds only X.
#
# Why plain `cargo test`: test binaries run one after another and the tests inside one binary run
# in parallel, one thread per core. Every test starts its own redis-server, proxy and demo order
# API on free ports, so tests never share state; on a 2-core CI machine that keeps at most two
# timing-sensitive tests (admission rates, drains) competing for the CPU at once.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

ensure_cargo
# curl: tests/readme.rs runs the README's "Running it" block, whose walkthrough is curl.
tools=(cc cmake curl redis-server redis-cli promtool node npm)
# The browser test uses /usr/bin/chromium unless WAITROOM_CHROMIUM names another binary.
[ -z "${WAITROOM_CHROMIUM:-}" ] && tools+=(chromium)
ensure_tools "${tools[@]}"
node_major=$(node --version | sed 's/^v\([0-9]*\).*/\1/')
if [ "${node_major:-0}" -lt 20 ]; then
  say "warning: node $(node --version) is older than the 20 the page tests need (https://nodejs.org)"
fi

cd "$ROOT"
# After the cd: a relative CARGO_TARGET_DIR names the same folder for the venv and for cargo.
ensure_api_tools
say "cargo build --bins"
cargo build --bins
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/debug

say "checking every shipped configuration with waitroom --check"
configs=(proxy.yaml)
if [ -d examples ]; then
  while IFS= read -r -d '' f; do configs+=("$f"); done \
    < <(find examples -type f \( -name '*.yaml' -o -name '*.yml' \) -print0 | sort -z)
fi
for config in "${configs[@]}"; do
  "$BIN/waitroom" --config "$config" --check
done

say "cargo test $*"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# Keep cargo's own exit status (pipefail) and add up every binary's result line at the end, so the
# run closes on the suite's total rather than on the last (possibly empty) test binary.
# --no-fail-fast: a failing test binary does not hide what the binaries after it would say (cargo
# still exits non-zero, and the line below counts every failure).
# The status is kept rather than let `set -e` end the script there: a failing run needs its
# summary line most, and still exits with cargo's status.
status=0
cargo test --no-fail-fast "$@" 2>&1 | tee "$log" || status=$?
awk '/^test result:/ { p += $4; f += $6 } END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
exit "$status"
