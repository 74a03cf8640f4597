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
#   FUZZ_TOOLCHAIN=stable    no cargo-fuzz and no AddressSanitizer: the targets are built by plain
#                            cargo with the coverage flags cargo-fuzz would pass, and the libFuzzer
#                            binaries run directly. CI uses this (its machine has one toolchain, so
#                            nightly cannot be fetched); the targets are the same code either way.
#
# With nightly: needs rustup with that toolchain and cargo-fuzz (`cargo install cargo-fuzz`);
# installs cargo-fuzz when it is missing. Corpora grow in fuzz/corpus/<target> (seeded on first run from
# the shipped proxy.yaml and a few tokens); a crash leaves its input in fuzz/artifacts/<target>
# and makes this script exit 1. The last line is `N passed, N failed`, N counting targets.
set -euo pipefail

cd "$(dirname "$0")/.."
seconds="${FUZZ_SECONDS:-60}"
jobs="${FUZZ_JOBS:-1}"
toolchain="${FUZZ_TOOLCHAIN:-nightly}"

say() { printf '==> %s\n' "$*" >&2; }

if [ "$toolchain" != stable ]; then
  rustup run "$toolchain" rustc --version >/dev/null 2>&1 \
    || { echo "error: the $toolchain toolchain is missing (rustup toolchain install $toolchain, or FUZZ_TOOLCHAIN=stable)" >&2; exit 1; }
  if ! cargo fuzz --version >/dev/null 2>&1; then
    say "installing cargo-fuzz"
    cargo install --locked cargo-fuzz
  fi
fi

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(sed -n 's/^name = "\([a-z_]*\)"$/\1/p' fuzz/Cargo.toml | grep -vx waitroom-fuzz)
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
if [ "$toolchain" = stable ]; then
  # What cargo-fuzz passes to rustc, less the sanitizer: libFuzzer's coverage counters, comparison
  # tracing, and the `fuzzing` cfg. opt-level 1 keeps a cold CI build short; debug assertions on,
  # as cargo-fuzz has them.
  export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares -Cdebug-assertions -Coverflow-checks"
  # An explicit --target keeps RUSTFLAGS off build scripts and proc macros, which run on the host
  # without libFuzzer's runtime to link against.
  host=$(rustc -vV | sed -n 's/^host: //p')
  CARGO_PROFILE_RELEASE_OPT_LEVEL=1 cargo build --release --manifest-path fuzz/Cargo.toml --bins \
    --target "$host" >&2
  run_target() { "fuzz/target/$host/release/$1" "fuzz/corpus/$1" -artifact_prefix="fuzz/artifacts/$1/" "${@:2}"; }
else
  cargo "+$toolchain" fuzz build >&2
  run_target() { cargo "+$toolchain" fuzz run "$1" "fuzz/corpus/$1" -- "${@:2}"; }
fi

passed=0
failed=0
printf '%-18s %14s %10s  %s\n' target executions exec/s result
for target in "${targets[@]}"; do
  log="fuzz/artifacts/$target.log"
  mkdir -p fuzz/artifacts
  say "fuzzing $target for ${seconds}s"
  args=(-max_total_time="$seconds" -print_final_stats=1 -max_len=16384)
  [ "$jobs" -gt 1 ] && args+=(-fork="$jobs")
  mkdir -p "fuzz/artifacts/$target"
  if run_target "$target" "${args[@]}" >"$log" 2>&1; then
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
