#!/usr/bin/env bash
# Runs each cargo-fuzz target of fuzz/ for a bounded time and reports how many inputs each ran.
#
#   scripts/fuzz.sh                         # every target, 60 s each
#   FUZZ_SECONDS=10 scripts/fuzz.sh         # shorter
#   scripts/fuzz.sh config_parse jwt_claims # only these
#
# Settings (environment variables):
#   FUZZ_SECONDS=60    wall-clock seconds per target (libFuzzer's -max_total_time)
#   FUZZ_JOBS=1        parallel fuzzing processes per target (libFuzzer's -fork)
#   FUZZ_TOOLCHAIN=nightly   cargo-fuzz needs a nightly toolchain (for -Zsanitizer)
#
# Needs rustup with that toolchain and cargo-fuzz (`cargo install cargo-fuzz`); installs
# cargo-fuzz when it is missing. Corpora grow in fuzz/corpus/<target> (seeded on first run from
# the shipped proxy.yaml and a few tokens); a crash leaves its input in fuzz/artifacts/<target>
# and makes this script exit 1. The last line is `N passed, N failed`, N counting targets.
set -euo pipefail

cd "$(dirname "$0")/.."
seconds="${FUZZ_SECONDS:-60}"
jobs="${FUZZ_JOBS:-1}"
toolchain="${FUZZ_TOOLCHAIN:-nightly}"

say() { printf '==> %s\n' "$*" >&2; }

rustup run "$toolchain" rustc --version >/dev/null 2>&1 \
  || { echo "error: the $toolchain toolchain is missing (rustup toolchain install $toolchain)" >&2; exit 1; }
if ! cargo fuzz --version >/dev/null 2>&1; then
  say "installing cargo-fuzz"
  cargo install --locked cargo-fuzz
fi

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo "+$toolchain" fuzz list)
fi

# Seeds: real inputs get the fuzzer past the first bytes quickly.
seed() { # seed TARGET NAME CONTENT
  mkdir -p "fuzz/corpus/$1"
  [ -e "fuzz/corpus/$1/$2" ] || printf '%s' "$3" >"fuzz/corpus/$1/$2"
}
seed config_parse proxy.yaml "$(cat proxy.yaml)"
seed config_parse jwt.yaml 'upstream: a:1
identity: {jwt: {from: "cookie:id", algorithms: [HS256, ES256], secret_env: HOME, public_key_file: k.pem, issuer: me, audience: shop, leeway: 5s}}
polling: {enforce: true, grace: 20%}
abuse: {identities_per_address: 3, trusted_proxies: [10.0.0.0/8, "::1"]}'
seed identity_headers user 'alice'
seed identity_headers jwt 'eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJhbGljZSIsImlzcyI6Im1lIiwiYXVkIjoic2hvcCJ9.c2lnbmF0dXJl'
seed jwt_claims claims '{"sub":"alice","iss":"me","aud":"shop","exp":4102444800,"nbf":0}'
# canonical_path: the first byte picks the method ('0' POST, '5' GET with a POST override).
seed canonical_path orders '0/api//../orders;x=1?id=%2e#f'
seed canonical_path ambiguous '5/api%2Fzz/../orders'
seed canonical_path absolute '0http://shop.example/api/%6Frders/./?q'

say "building the fuzz targets ($toolchain)"
cargo "+$toolchain" fuzz build >&2

passed=0
failed=0
printf '%-18s %14s %10s  %s\n' target executions exec/s result
for target in "${targets[@]}"; do
  log="fuzz/artifacts/$target.log"
  mkdir -p fuzz/artifacts
  say "fuzzing $target for ${seconds}s"
  args=(-max_total_time="$seconds" -print_final_stats=1 -max_len=16384)
  [ "$jobs" -gt 1 ] && args+=(-fork="$jobs")
  if cargo "+$toolchain" fuzz run "$target" "fuzz/corpus/$target" -- "${args[@]}" >"$log" 2>&1; then
    result=ok
    passed=$((passed + 1))
  else
    result="CRASH (see $log and fuzz/artifacts/$target/)"
    failed=$((failed + 1))
  fi
  # libFuzzer's final stats: "stat::number_of_executed_units: N"; -fork prints "Done N runs".
  runs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' | awk '{s+=$1} END {print s+0}')
  [ "$runs" -gt 0 ] || runs=$(grep -Eo 'Done [0-9]+ runs' "$log" | grep -Eo '[0-9]+' | tail -1 || echo 0)
  rate=$(( runs / (seconds > 0 ? seconds : 1) ))
  printf '%-18s %14s %10s  %s\n' "$target" "$runs" "$rate" "$result"
done
echo "fuzz: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
