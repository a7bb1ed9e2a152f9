#!/usr/bin/env bash
# A private container engine for the deploy tier (.ci/deploy), on a root Debian machine that has none and
# cannot reach Docker Hub:
#   - Debian's docker.io, its dockerd started in the background with a data root, exec root, socket and
#     pidfile of its own, and without touching the host's firewall or routing (no iptables rules, no IP
#     forwarding, no default bridge): compose's own bridge networks connect the containers, and docker-proxy
#     publishes their ports on the host's loopback;
#   - Compose v2 as a CLI plugin in a DOCKER_CONFIG of its own: the `docker-compose` package of Debian's next
#     suite (bookworm has only compose v1), fetched with `apt-get download` through a sources list and list
#     directory of its own, so the host's apt state is not changed, and unpacked with `dpkg -x`;
#   - the base image, fl-base:bookworm: `debootstrap --variant=minbase bookworm` with python3, a venv at
#     /opt/venv first on PATH, and this machine's CA certificates (its egress may re-sign TLS), then `docker
#     import`;
#   - fl-redis:bookworm, Debian's redis-server on that base (docker/redis/), for the compose files' Redis;
#   - a PEP 503 index on 127.0.0.1 serving the CPU build of torch and its dependencies (a container on the
#     host network), which the Dockerfiles' TORCH_INDEX_URL build argument points at.
# Every step is idempotent: what exists and is current is kept (images by a recipe label).
#
#   docker/engine.sh up       # all of the above; then: eval "$(docker/engine.sh env)"
#   docker/engine.sh start    # only install and start the daemon and the compose plugin
#   docker/engine.sh env      # the variables that point a docker CLI at this engine
#   docker/engine.sh status
#   docker/engine.sh stop     # stops the index and the daemon; images and build cache stay
#   docker/engine.sh purge    # stop, then remove the data root and every cached download
#
# Settings (environment): FL_ENGINE_DATA (/var/lib/fl-docker), FL_ENGINE_RUN (/run/fl-docker),
# FL_ENGINE_CACHE (/var/cache/fl-docker), FL_DEBIAN_MIRROR (http://deb.debian.org/debian),
# FL_COMPOSE_SUITE (trixie), FL_WHEEL_INDEX_PORT (17141), FL_TORCH_WHEEL (a torch-2.13.0+cpu wheel to serve;
# otherwise one found on this machine, otherwise downloaded from PyPI's CPU index).
set -euo pipefail

DATA=${FL_ENGINE_DATA:-/var/lib/fl-docker}
RUN=${FL_ENGINE_RUN:-/run/fl-docker}
CACHE=${FL_ENGINE_CACHE:-/var/cache/fl-docker}
MIRROR=${FL_DEBIAN_MIRROR:-http://deb.debian.org/debian}
COMPOSE_SUITE=${FL_COMPOSE_SUITE:-trixie}
INDEX_PORT=${FL_WHEEL_INDEX_PORT:-17141}
TORCH_VERSION=2.13.0
SOCKET=$RUN/docker.sock
PIDFILE=$RUN/docker.pid
LOG=$DATA.log
# Debian's CLI, not another one earlier on PATH: it matches the daemon's API and finds DOCKER_CONFIG's plugins.
DOCKER=/usr/bin/docker
CLI_CONFIG=$CACHE/cli
BASE_IMAGE=fl-base:bookworm
REDIS_IMAGE=fl-redis:bookworm
INDEX_CONTAINER=fl-wheel-index
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

export DOCKER_HOST=unix://$SOCKET DOCKER_CONFIG=$CLI_CONFIG DOCKER_BUILDKIT=0

say() { printf '[engine] %s\n' "$*" >&2; }
# The CLI warns on every host-network build or run that the daemon does not forward IPv4: by design here
# (--ip-forward=false), and wrong ("Networking will not work") for the host network.
quiet_forwarding() { grep -v '^WARNING: IPv4 forwarding is disabled' >&2 || true; }
die() { say "error: $*"; exit 1; }

need_root() {
  [ "$(id -u)" = 0 ] || die "must run as root (it installs packages and starts dockerd)"
}

# ---- packages -------------------------------------------------------------------------------------

install_packages() {
  local missing=()
  command -v dockerd >/dev/null || [ -x /usr/sbin/dockerd ] || missing+=(docker.io)
  [ -x "$DOCKER" ] || missing+=(docker.io)
  command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ] || missing+=(debootstrap)
  [ ${#missing[@]} -gt 0 ] || return 0
  say "installing ${missing[*]}"
  # docker.io's maintainer scripts would start the system's dockerd (default data root, iptables rules, docker0);
  # a policy-rc.d answering 101 stops that. One that exists already is left as it is.
  local policy=/usr/sbin/policy-rc.d own_policy=""
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy" && own_policy=1
  fi
  local rc=0
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      "${missing[@]}"; } >&2 || rc=$?
  [ -z "$own_policy" ] || rm -f "$policy"
  [ "$rc" = 0 ] || die "apt-get install ${missing[*]} failed ($rc)"
}

compose_plugin() {
  local plugin=$CLI_CONFIG/cli-plugins/docker-compose
  if [ -x "$plugin" ] && "$plugin" version >/dev/null 2>&1; then return 0; fi
  say "fetching docker-compose (compose v2) from Debian $COMPOSE_SUITE"
  local apt=$CACHE/apt-$COMPOSE_SUITE
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/sources.list.d" "$apt/preferences.d" \
    "$CACHE/compose" "$CLI_CONFIG/cli-plugins"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR $COMPOSE_SUITE main" \
    > "$apt/sources.list"
  local opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o "Dir::Etc::SourceParts=$apt/sources.list.d"
              -o "Dir::Etc::PreferencesParts=$apt/preferences.d" -o "Dir::State::Lists=$apt/lists"
              -o "Dir::Cache=$apt/cache" -o "APT::Sandbox::User=root")
  apt-get "${opts[@]}" update -q >&2
  rm -rf "$CACHE/compose"/*
  (cd "$CACHE/compose" && apt-get "${opts[@]}" download -q docker-compose >&2)
  local deb
  deb=$(ls "$CACHE"/compose/docker-compose_*.deb)
  dpkg -x "$deb" "$CACHE/compose/root"
  local binary=$CACHE/compose/root/usr/libexec/docker/cli-plugins/docker-compose
  [ -x "$binary" ] || die "$deb holds no usr/libexec/docker/cli-plugins/docker-compose"
  ln -sfn "$binary" "$plugin"
  say "$("$plugin" version) from $(basename "$deb")"
}

# ---- the daemon -----------------------------------------------------------------------------------

daemon_up() { [ -S "$SOCKET" ] && "$DOCKER" version >/dev/null 2>&1; }

start_daemon() {
  if daemon_up; then return 0; fi
  if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    say "dockerd $(cat "$PIDFILE") is running but does not answer; waiting for it"
  else
    rm -f "$PIDFILE" "$SOCKET"
    mkdir -p "$DATA" "$RUN"
    say "starting dockerd (data root $DATA, socket $SOCKET, log $LOG)"
    # setsid: the daemon outlives this script and the CI step's process group.
    (cd / && setsid /usr/sbin/dockerd \
        --data-root "$DATA" --exec-root "$RUN/exec" --pidfile "$PIDFILE" -H "unix://$SOCKET" \
        --storage-driver overlay2 --iptables=false --ip-forward=false --ip-masq=false --bridge=none \
        >>"$LOG" 2>&1 </dev/null &)
  fi
  local deadline=$((SECONDS + 60))
  until daemon_up; do
    if [ $SECONDS -ge $deadline ]; then
      tail -n 30 "$LOG" >&2 || true
      die "dockerd did not answer on $SOCKET within 60 s (log: $LOG)"
    fi
    sleep 0.5
  done
  say "dockerd $("$DOCKER" version --format '{{.Server.Version}}') answers on $SOCKET"
}

stop_daemon() {
  [ -f "$PIDFILE" ] || { say "dockerd is not running"; return 0; }
  local pid
  pid=$(cat "$PIDFILE")
  if kill -0 "$pid" 2>/dev/null; then
    say "stopping dockerd $pid"
    kill -TERM "$pid"
    local deadline=$((SECONDS + 60))
    while kill -0 "$pid" 2>/dev/null; do
      [ $SECONDS -lt $deadline ] || { say "dockerd $pid ignored SIGTERM for 60 s; killing it"; kill -KILL "$pid"; }
      sleep 0.5
    done
  fi
  rm -f "$PIDFILE"
}

# ---- images ---------------------------------------------------------------------------------------

image_label() {  # image, label -> the label's value, or nothing when the image is absent
  "$DOCKER" image inspect --format "{{index .Config.Labels \"$2\"}}" "$1" 2>/dev/null || true
}

base_recipe() {
  # What the base image is made of; any change (this machine's CA certificates included) makes a new one.
  {
    echo "bookworm minbase python3 python3-venv ca-certificates venv=/opt/venv v1 $MIRROR"
    cat /usr/local/share/ca-certificates/*.crt 2>/dev/null || true
  } | sha256sum | cut -c1-16
}

base_image() {
  local recipe
  recipe=$(base_recipe)
  if [ "$(image_label "$BASE_IMAGE" fl.recipe)" = "$recipe" ]; then return 0; fi
  local tarball=$CACHE/base/bookworm-$recipe.tar
  if [ ! -s "$tarball" ]; then
    say "building the base root file system (debootstrap --variant=minbase bookworm)"
    local root=$CACHE/base/rootfs
    rm -rf "$root" && mkdir -p "$root"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$root" "$MIRROR" \
      > "$CACHE/base/debootstrap.log" 2>&1 || { tail -n 30 "$CACHE/base/debootstrap.log" >&2; die "debootstrap failed"; }
    # The machine's own CA certificates: a TLS-intercepting egress re-signs PyPI's certificate with them.
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/" 2>/dev/null || true
    local security=${MIRROR%/debian}/debian-security
    printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb %s bookworm-security main\n' \
      "$MIRROR" "$MIRROR" "$security" > "$root/etc/apt/sources.list"
    chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive sh -c '
        set -e
        apt-get update -q && apt-get -y -q upgrade
        update-ca-certificates
        python3 -m venv /opt/venv
        apt-get clean && rm -rf /var/lib/apt/lists/* /var/log/apt/* /var/log/dpkg.log' \
      > "$CACHE/base/chroot.log" 2>&1 || { tail -n 30 "$CACHE/base/chroot.log" >&2; die "configuring the base failed"; }
    tar -C "$root" --numeric-owner -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
    rm -rf "$root"
  fi
  say "importing $BASE_IMAGE"
  "$DOCKER" import \
    --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' --change "LABEL fl.recipe=$recipe" --change 'CMD ["python3"]' \
    "$tarball" "$BASE_IMAGE" >/dev/null
}

redis_image() {
  local recipe
  recipe=$( { "$DOCKER" image inspect --format '{{.Id}}' "$BASE_IMAGE"; cat "$HERE"/redis/*; } | sha256sum | cut -c1-16)
  if [ "$(image_label "$REDIS_IMAGE" fl.recipe)" = "$recipe" ]; then return 0; fi
  say "building $REDIS_IMAGE"
  "$DOCKER" build -q --network host --build-arg "BASE_IMAGE=$BASE_IMAGE" --label "fl.recipe=$recipe" \
    -t "$REDIS_IMAGE" "$HERE/redis" 2> >(quiet_forwarding) >/dev/null
}

# ---- the wheel index ------------------------------------------------------------------------------

find_torch_wheel() {
  local name="torch-$TORCH_VERSION+cpu-cp311-cp311-*.whl" found
  if [ -n "${FL_TORCH_WHEEL:-}" ]; then echo "$FL_TORCH_WHEEL"; return; fi
  for dir in "$CACHE/index/files" /opt/wheels "$HOME/.cache/pip" /root/.cache/pip; do
    found=$(find "$dir" -name "$name" -print -quit 2>/dev/null || true)
    if [ -n "$found" ]; then echo "$found"; return; fi
  done
  find / -xdev -name "$name" -print -quit 2>/dev/null || true
}

wheel_index() {
  local files=$CACHE/index/files
  mkdir -p "$files"
  if [ ! -s "$CACHE/index/simple/torch/index.html" ]; then
    make_wheel_index "$files"
  fi
  start_wheel_index
  say "wheel index: http://127.0.0.1:$INDEX_PORT/simple ($(ls "$files" | wc -l) files)"
}

make_wheel_index() {
  local files=$1 wheel
  wheel=$(find_torch_wheel)
  if [ -n "$wheel" ] && [ ! -e "$files/$(basename "$wheel")" ]; then
    cp "$wheel" "$files/"
  fi
  # torch's wheel and its dependencies, resolved by the base image's own pip (Python 3.11, the images' Python).
  "$DOCKER" run --rm --network host -v "$files:/files" "$BASE_IMAGE" sh -c "
      pip download -q --dest /files --find-links /files torch==$TORCH_VERSION+cpu 2>/dev/null ||
      pip download -q --dest /files --find-links /files torch==$TORCH_VERSION+cpu \
          --extra-index-url https://download.pytorch.org/whl/cpu" 2> >(quiet_forwarding) >&2 \
    || die "no torch $TORCH_VERSION+cpu wheel: none on this machine (FL_TORCH_WHEEL) and none downloadable"
  # The PEP 503 pages, written by the base image's Python: the host may have none.
  "$DOCKER" run --rm -i --network none -v "$CACHE/index:/index" "$BASE_IMAGE" python - <<'EOF'
import hashlib, html, pathlib, re, shutil, urllib.parse
index = pathlib.Path("/index")
simple = index / "simple.tmp"
shutil.rmtree(simple, ignore_errors=True)
projects = {}
for f in sorted((index / "files").iterdir()):
    if f.suffix == ".whl" or f.name.endswith(".tar.gz"):
        name = re.sub(r"[-_.]+", "-", f.name.split("-")[0]).lower()
        projects.setdefault(name, []).append(f)
for name, files in projects.items():
    (simple / name).mkdir(parents=True)
    links = "".join(
        f'<a href="../../files/{urllib.parse.quote(f.name)}#sha256={hashlib.sha256(f.read_bytes()).hexdigest()}">'
        f"{html.escape(f.name)}</a><br>\n" for f in files)
    (simple / name / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
(simple / "index.html").write_text("<!DOCTYPE html><html><body>\n" + "".join(
    f'<a href="{n}/">{n}</a><br>\n' for n in sorted(projects)) + "</body></html>\n")
shutil.rmtree(index / "simple", ignore_errors=True)
simple.rename(index / "simple")
EOF
}

start_wheel_index() {
  if [ "$("$DOCKER" inspect --format '{{.State.Running}}' "$INDEX_CONTAINER" 2>/dev/null)" != true ]; then
    "$DOCKER" rm -f "$INDEX_CONTAINER" >/dev/null 2>&1 || true
    # On the host network, bound to its loopback: builds (`--network host`) reach it, nothing else does.
    "$DOCKER" run -d --name "$INDEX_CONTAINER" --network host -v "$CACHE/index:/srv:ro" "$BASE_IMAGE" \
      python -m http.server --bind 127.0.0.1 --directory /srv "$INDEX_PORT" 2> >(quiet_forwarding) >/dev/null
  fi
  local deadline=$((SECONDS + 30))
  until "$DOCKER" exec "$INDEX_CONTAINER" python -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$INDEX_PORT/simple/torch/', timeout=2)" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || die "the wheel index did not answer on 127.0.0.1:$INDEX_PORT"
    sleep 0.5
  done
}

# ---- commands -------------------------------------------------------------------------------------

print_env() {
  cat <<EOF
export DOCKER_HOST=unix://$SOCKET
export DOCKER_CONFIG=$CLI_CONFIG
export DOCKER_BUILDKIT=0
export FL_DOCKER=$DOCKER
export FL_BASE_IMAGE=$BASE_IMAGE
export FL_REDIS_IMAGE=$REDIS_IMAGE
export FL_TORCH_INDEX_URL=http://127.0.0.1:$INDEX_PORT/simple
EOF
}

case "${1:-up}" in
  up)     need_root; install_packages; compose_plugin; start_daemon; base_image; redis_image; wheel_index ;;
  start)  need_root; install_packages; compose_plugin; start_daemon ;;
  env)    print_env ;;
  status)
    if daemon_up; then
      say "dockerd $("$DOCKER" version --format '{{.Server.Version}}') on $SOCKET; data root $DATA"
      "$DOCKER" compose version >&2 || true
      "$DOCKER" images >&2
      "$DOCKER" ps -a >&2
    else
      say "no daemon answers on $SOCKET"; exit 1
    fi ;;
  stop)
    need_root
    if daemon_up; then "$DOCKER" rm -f "$INDEX_CONTAINER" >/dev/null 2>&1 || true; fi
    stop_daemon ;;
  purge)
    need_root
    if daemon_up; then "$DOCKER" rm -f "$INDEX_CONTAINER" >/dev/null 2>&1 || true; fi
    stop_daemon
    # what the daemon leaves mounted (its netns file; the overlays of one that died) would keep files busy
    grep -oE " ($DATA|$RUN)/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
    rm -rf "$DATA" "$RUN" "$CACHE" "$LOG" ;;
  *) echo "usage: $0 up|start|env|status|stop|purge" >&2; exit 2 ;;
esac
