# shellcheck shell=bash
# Shared helpers for scripts/demo.sh, scripts/test.sh, .ci/run and bench/*.sh. Source it; do not
# run it.
#
# Everything here is for a Debian/Ubuntu machine with Rust installed: missing system tools come
# from apt-get, with sudo only when we are not already root.

# Messages go to stderr so that a script's stdout stays what the script itself prints.
say() { printf '==> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# Runs a command as root: directly when we are root (CI, containers), else through sudo.
as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    die "need root to run '$*' (install sudo, or run as root)"
  fi
}

_apt_updated=0

# apt_install PACKAGE...: installs packages, running `apt-get update` at most once per script.
apt_install() {
  command -v apt-get >/dev/null 2>&1 \
    || die "apt-get not found: install $* by hand (this script knows Debian/Ubuntu only)"
  if [ "$_apt_updated" -eq 0 ]; then
    say "apt-get update"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    _apt_updated=1
  fi
  say "apt-get install $*"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}

# ensure_tools TOOL...: installs the Debian package of every tool that is not on PATH.
# Known tools: cc, cmake, redis-server, redis-cli, promtool, systemd-analyze, curl, node, npm,
# chromium.
ensure_tools() {
  local tool pkg missing=()
  for tool in "$@"; do
    command -v "$tool" >/dev/null 2>&1 && continue
    case "$tool" in
      cc) pkg=build-essential ;;          # the linker Rust needs, and the C compiler zlib-ng needs
      cmake) pkg=cmake ;;                 # pingora builds zlib-ng with cmake
      redis-server) pkg=redis-server ;;
      redis-cli) pkg=redis-tools ;;
      promtool) pkg=prometheus ;;         # promtool ships in Debian's prometheus package
      systemd-analyze) pkg=systemd ;;     # tests/deploy.rs verifies deploy/systemd/waitroom.service
      curl) pkg=curl ;;
      node) pkg=nodejs ;;                 # Debian 12 ships 18; the page tests want 20+ (see README)
      npm) pkg=npm ;;
      chromium) pkg=chromium ;;           # Debian's name; on Ubuntu set WAITROOM_CHROMIUM instead
      *) die "ensure_tools: do not know how to install '$tool'" ;;
    esac
    missing+=("$pkg")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    # ca-certificates keeps cargo able to fetch crates on a minimal image.
    apt_install "${missing[@]}" ca-certificates
  fi
  for tool in "$@"; do
    command -v "$tool" >/dev/null 2>&1 || die "'$tool' is still missing after apt-get install"
  done
}

# ensure_api_tools: the Python tools the API description's, the config schema's and the deployment
# files' tests run (tests/openapi.rs, tests/schema.rs, tests/deploy.rs: hadolint and
# kubernetes-validate), at the
# versions docs/requirements-api.txt pins, in a venv of their own under the target directory
# (target/api-tools, or $CARGO_TARGET_DIR/api-tools), where the test looks for them. A venv keeps
# them out of the system's Python and off PATH. pip runs only when a pinned version is missing
# from the venv, so a second run costs a tenth of a second.
ensure_api_tools() {
  local root req venv
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  req="$root/docs/requirements-api.txt"
  venv="${CARGO_TARGET_DIR:-$root/target}/api-tools"
  if [ -x "$venv/bin/python" ] && _api_tools_pinned "$venv/bin/python" "$req"; then
    return 0
  fi
  if [ ! -x "$venv/bin/python" ]; then
    command -v python3 >/dev/null 2>&1 || apt_install python3 python3-venv
    # Debian's python3 keeps `venv`'s pip bootstrap (ensurepip) in a package of its own.
    python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || apt_install python3-venv
    rm -rf "$venv"
    python3 -m venv "$venv"
  fi
  say "installing the API tools of docs/requirements-api.txt into $venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input -r "$req"
  _api_tools_pinned "$venv/bin/python" "$req" || die "$venv lacks the versions $req pins"
}

# _api_tools_pinned PYTHON REQUIREMENTS: true when PYTHON has every NAME==VERSION of the file.
_api_tools_pinned() {
  "$1" - "$2" <<'PY' >/dev/null 2>&1
import sys, importlib.metadata as m
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if line:
        name, _, version = line.partition("==")
        try:
            ok = m.version(name.strip()) == version.strip()
        except m.PackageNotFoundError:
            ok = False
        if not ok:
            sys.exit(1)
PY
}

# port_in_use PORT: true when something accepts connections on 127.0.0.1:PORT.
port_in_use() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# free_port [PREFERRED]: prints PREFERRED when nothing listens there, else a free port picked at
# random from 20000-32767 (below Linux's default ephemeral range, 32768-60999, so outgoing connections do not
# grab it in between).
free_port() {
  local port
  if [ -n "${1:-}" ] && ! port_in_use "$1"; then
    echo "$1"
    return
  fi
  for _ in $(seq 1 100); do
    port=$((20000 + (RANDOM * 32768 + RANDOM) % 12768))
    if ! port_in_use "$port"; then
      echo "$port"
      return
    fi
  done
  die "no free port found"
}

# free_ports N: prints N distinct ports the kernel has just handed out, on one line (all N are
# held until each is known, so none repeats, and none is any socket's local port at that moment:
# a random pick can land on a client connection's port in a benchmark with thousands of them).
free_ports() {
  python3 -c 'import socket, sys
held = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in held:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in held))' "$1"
}

# wait_until SECONDS DESCRIPTION COMMAND...: retries COMMAND every 0.1 s until it succeeds.
# A COMMAND that answers 99 means "this will never succeed" (the process died): stop at once.
wait_until() {
  local seconds=$1 what=$2 i rc
  shift 2
  for ((i = 0; i < seconds * 10; i++)); do
    rc=0
    "$@" >/dev/null 2>&1 || rc=$?
    [ "$rc" -eq 0 ] && return 0
    [ "$rc" -eq 99 ] && break
    sleep 0.1
  done
  say "gave up waiting for $what"
  return 1
}

# stop_all GRACE PID...: SIGINT to every PID (their own clean shutdown), SIGKILL to whichever is
# still there GRACE seconds later, then reaps them all. Made for EXIT traps.
stop_all() {
  local grace=$1 pid
  shift
  for pid in "$@"; do kill -INT "$pid" 2>/dev/null || true; done
  sleep "$grace"
  for pid in "$@"; do kill -KILL "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}

# ensure_cargo: finds cargo, also in a fresh shell where rustup's PATH line was not read yet.
ensure_cargo() {
  if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
    # shellcheck source=/dev/null
    . "$HOME/.cargo/env"
  fi
  command -v cargo >/dev/null 2>&1 || die "cargo not found: install Rust first (https://rustup.rs)"
}

# bench_paths_room LISTEN_PORT METRICS_PORT UPSTREAM_PORT REDIS_PORT: the room bench/callgrind.sh
# and bench/cpu-per-request.sh measure paths in, as YAML on stdout: the demo API's echo as the
# protected route, nobody admitted (tokens are seeded), no held polls, room for a seeded line.
# One definition, so the two scripts' numbers stay numbers of the same room.
bench_paths_room() {
  cat <<EOF
listen: "127.0.0.1:$1"
metrics_listen: "127.0.0.1:$2"
upstream: "127.0.0.1:$3"
redis: { url: "redis://127.0.0.1:$4", key_prefix: bench }
protected:
  - { method: GET, path: /echo/protected }
admission: { interval: 1h, batch_size: 1 }
endpoints: { hold: 0s }
queue: { capacity: 2000000 }
EOF
}

# bench_nginx_return PORT: the server block (for an nginx.conf's http block) of nginx answering by
# itself what the status paths' bound answers: 200 with a WAITING body of waitroom's size. One
# definition for bench/run.sh, bench/callgrind.sh and bench/cpu-per-request.sh, so the bound is
# the same answer in all three.
bench_nginx_return() {
  cat <<EOF
  server {
    listen 127.0.0.1:$1 backlog=4096;
    location / {
      default_type application/json;
      return 200 '{"status":"WAITING","position":50000,"estimatedWaitTime":180000,"pollAfter":2000}\n';
    }
  }
EOF
}
