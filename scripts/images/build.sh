#!/usr/bin/env bash
# Build, with podman and without any registry, the container images that Trainyard's
# tests and examples use:
#   localhost/trainyard/busybox:test  a static busybox, one symlink per applet (< 1 s)
#   localhost/trainyard/python:test   Debian bookworm minbase + python3 and pip,
#                                     also tagged us-docker.pkg.dev/trainyard-test/images/python:test
#
# Usage: scripts/images/build.sh [--only busybox|python]... [--force] [--no-cache]
#   --only NAME  build only this image (may be repeated; default: all)
#   --force      rebuild an image that already exists (the python rootfs cache is reused)
#   --no-cache   also redo the python rootfs (debootstrap + apt-get) instead of using the cache
#
# Prints one line per image to stdout: its name, what was done, and how long it took.
# Progress of the slow steps goes to a log file, whose end is printed on failure.
#
# Environment:
#   TRAINYARD_IMAGE_CACHE    where the python rootfs tarball is kept (/var/cache/trainyard-images)
#   TRAINYARD_DEBIAN_MIRROR  the Debian mirror for debootstrap (default: the one apt uses here)
#   TRAINYARD_DEBIAN_SUITE   the Debian suite (bookworm)
#   TRAINYARD_PODMAN_RUNTIME the OCI runtime passed to podman (runc; crun fails on hosts with
#                            hybrid cgroups). When CONTAINERS_CONF is set and this is not,
#                            podman's configured runtime is used instead.
set -euo pipefail

usage() { sed -n '8,12p' "$0" | sed 's/^# \{0,1\}//'; }

force=0
no_cache=0
only=()
while [ $# -gt 0 ]; do
  case "$1" in
    --only) [ $# -ge 2 ] || { echo "build.sh: --only needs busybox or python" >&2; exit 2; }; only+=("$2"); shift 2 ;;
    --only=*) only+=("${1#--only=}"); shift ;;
    --force) force=1; shift ;;
    --no-cache) no_cache=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "build.sh: unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
done
[ ${#only[@]} -gt 0 ] || only=(busybox python)
for o in "${only[@]}"; do
  case "$o" in busybox | python) ;; *) echo "build.sh: --only takes busybox or python, not: $o" >&2; exit 2 ;; esac
done
want() { local o; for o in "${only[@]}"; do [ "$o" = "$1" ] && return 0; done; return 1; }

if [ -n "${TRAINYARD_PODMAN_RUNTIME:-}" ]; then
  podman=(podman --runtime "$TRAINYARD_PODMAN_RUNTIME")
elif [ -n "${CONTAINERS_CONF:-}" ]; then
  podman=(podman)
else
  podman=(podman --runtime runc)
fi

BUSYBOX_IMAGE=localhost/trainyard/busybox:test
PYTHON_IMAGE=localhost/trainyard/python:test
ENTRYPOINT_IMAGE=localhost/trainyard/entrypoint:test
# The examples name python:3.11 (what a registry would give); without a registry, the
# Debian Python 3.11 image stands in for it.
EXAMPLES_ALIAS=docker.io/library/python:3.11
PYTHON_ALIAS=us-docker.pkg.dev/trainyard-test/images/python:test
PYTHON_PACKAGES=(python3-minimal python3-pip python3-setuptools python3-wheel python3-venv)
PATH_DEBIAN=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
suite="${TRAINYARD_DEBIAN_SUITE:-bookworm}"
cache="${TRAINYARD_IMAGE_CACHE:-/var/cache/trainyard-images}"

work="$(mktemp -d "${TMPDIR:-/var/tmp}/trainyard-images.XXXXXX")"
cleanup() {
  # Never rm -rf through a mount left in the chroot.
  if [ -d "$work/python/proc" ] && mountpoint -q "$work/python/proc"; then
    umount "$work/python/proc" || umount -l "$work/python/proc" || true
  fi
  if grep -q " $work/" /proc/self/mounts; then
    echo "build.sh: WARNING: something is still mounted under $work; not removing it" >&2
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT

now() { echo "$EPOCHREALTIME"; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2fs", b - a }'; }
report() { printf '%-52s %-36s %s\n' "$1" "$2" "$3"; }
die() { echo "build.sh: ERROR: $*" >&2; exit 1; }

# Run a noisy command with its output in a log; print the log's end if it fails.
logged() {
  local log="$1"; shift
  if ! "$@" >>"$log" 2>&1; then
    echo "build.sh: ERROR: failed: $*" >&2
    echo "--- last lines of $log ---" >&2
    tail -n 40 "$log" >&2
    exit 1
  fi
}

# Remove an image that a rebuild left untagged (best effort: a container may use it).
drop_old() {
  local old="$1" new
  [ -n "$old" ] || return 0
  new="$("${podman[@]}" image inspect --format '{{.Id}}' "$2" 2>/dev/null || true)"
  [ "$old" != "$new" ] && "${podman[@]}" rmi "$old" >/dev/null 2>&1 || true
}

build_busybox() {
  local t0 old="" root="$work/busybox" applet
  t0="$(now)"
  if [ "$force" = 0 ] && "${podman[@]}" image exists "$BUSYBOX_IMAGE"; then
    report "$BUSYBOX_IMAGE" "exists, skipped (--force rebuilds)" "$(since "$t0")"
    return
  fi
  [ -x /bin/busybox ] || die "/bin/busybox is missing (apt-get install busybox-static)"
  old="$("${podman[@]}" image inspect --format '{{.Id}}' "$BUSYBOX_IMAGE" 2>/dev/null || true)"
  mkdir -p "$root"/{bin,etc,root,tmp,proc,sys,dev}
  cp /bin/busybox "$root/bin/busybox"
  chmod 0755 "$root/bin/busybox"
  while IFS= read -r applet; do
    # "busybox" itself is the binary: a link there would point at itself.
    case "$applet" in "" | busybox | */*) continue ;; esac
    ln -s busybox "$root/bin/$applet"
  done < <(/bin/busybox --list)
  chmod 1777 "$root/tmp"
  chmod 0700 "$root/root"
  printf '%s\n' 'root:x:0:0:root:/root:/bin/sh' 'nobody:x:65534:65534:nobody:/nonexistent:/bin/false' >"$root/etc/passwd"
  printf '%s\n' 'root:x:0:' 'nogroup:x:65534:' >"$root/etc/group"
  tar -C "$root" --numeric-owner --owner=0 --group=0 -c . |
    "${podman[@]}" import -q --change 'CMD ["/bin/sh"]' --change 'ENV PATH=/bin' --change 'WORKDIR /' - "$BUSYBOX_IMAGE" >/dev/null
  drop_old "$old" "$BUSYBOX_IMAGE"
  report "$BUSYBOX_IMAGE" "built" "$(since "$t0")"
}

# The mirror apt uses here for "$suite": deb822 *.sources stanzas and one-line *.list
# entries, in apt's order (sources.list, then sources.list.d/ sorted).
apt_mirror() {
  local f files=()
  [ -f /etc/apt/sources.list ] && files+=(/etc/apt/sources.list)
  for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] && files+=("$f")
  done
  [ ${#files[@]} -gt 0 ] || return 0
  for f in $(printf '%s\n' "${files[@]}" | sort -u); do
    case "$f" in
      *.sources)
        awk -v suite="$suite" '
          function flush() {
            if (types ~ /(^| )deb( |$)/ && (" " suites " ") ~ (" " suite " ") && tolower(enabled) != "no" && uris != "") {
              split(uris, u, " "); print u[1]; found = 1; exit
            }
            types = ""; suites = ""; uris = ""; enabled = ""
          }
          /^[ \t]*#/ { next }
          /^[ \t]*$/ { flush(); next }
          {
            line = $0; key = tolower(line); sub(/:.*/, "", key)
            val = line; sub(/^[^:]*:[ \t]*/, "", val); gsub(/[ \t]+/, " ", val)
            if (key == "types") types = val
            else if (key == "suites") suites = val
            else if (key == "uris") uris = val
            else if (key == "enabled") enabled = val
          }
          END { if (!found) flush() }' "$f"
        ;;
      *)
        awk -v suite="$suite" '
          /^[ \t]*deb[ \t]/ {
            sub(/^[ \t]*deb[ \t]+/, "")
            if ($0 ~ /^\[/) sub(/^\[[^]]*\][ \t]*/, "")
            if ($2 == suite) { print $1; exit }
          }' "$f"
        ;;
    esac
  done | grep -E '^(https?|ftp|file):' | head -n 1 || true
}

# The rootfs tarball in the cache, named by what goes into it.
python_tarball() {
  local key
  key="$(printf '%s\n' "recipe=1" "suite=$suite" "variant=minbase" "${PYTHON_PACKAGES[@]}" | sha256sum | cut -c1-12)"
  echo "$cache/python-$suite-$key.tar"
}

# debootstrap + apt-get into $work/python, then write the tarball $1 (logging to $2).
make_python_rootfs() {
  local tarball="$1" log="$2" root="$work/python" mirror
  [ "$(id -u)" = 0 ] || die "the python image needs root (debootstrap, chroot)"
  command -v debootstrap >/dev/null || die "debootstrap is missing (apt-get install debootstrap)"
  mirror="${TRAINYARD_DEBIAN_MIRROR:-}"
  [ -n "$mirror" ] || mirror="$(apt_mirror)"
  [ -n "$mirror" ] || die "found no '$suite' mirror in /etc/apt/sources.list{,.d/}; set TRAINYARD_DEBIAN_MIRROR"
  echo "mirror: $mirror" >>"$log"
  mkdir -p "$cache" "$root"
  logged "$log" debootstrap --variant=minbase "$suite" "$root" "$mirror"
  mount -t proc proc "$root/proc"
  local chr=(chroot "$root" /usr/bin/env -i "PATH=$PATH_DEBIAN" HOME=/root LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive)
  logged "$log" "${chr[@]}" apt-get update
  logged "$log" "${chr[@]}" apt-get install -y --no-install-recommends "${PYTHON_PACKAGES[@]}"
  logged "$log" "${chr[@]}" apt-get clean
  umount "$root/proc"
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/cache/debconf/*-old \
    "$root"/var/log/apt/* "$root"/var/log/dpkg.log "$root"/var/log/alternatives.log "$root"/var/log/bootstrap.log \
    "$root"/tmp/* "$root"/var/tmp/* "$root"/dev/* "$root"/root/.cache
  # The host's files: podman supplies these when a container starts.
  : >"$root/etc/resolv.conf"
  : >"$root/etc/hostname"
  # Like the official python images: pip may install into the image's own Python
  # (PEP 668's marker makes a bare `pip install` refuse).
  rm -f "$root"/usr/lib/python3*/EXTERNALLY-MANAGED
  # The working directory: writable for whatever uid a job runs as.
  mkdir -p "$root/app"
  chmod 0777 "$root/app"
  chmod 1777 "$root/tmp"
  tar -C "$root" --numeric-owner -cf "$tarball.tmp" .
  mv -f "$tarball.tmp" "$tarball"
  rm -rf "$root"
}

build_python() {
  # Outside $work, so that it outlives a failed build.
  local t0 old="" log="${TMPDIR:-/var/tmp}/trainyard-images-python.log" tarball how="built from the cached rootfs"
  t0="$(now)"
  if [ "$force" = 0 ] && "${podman[@]}" image exists "$PYTHON_IMAGE"; then
    "${podman[@]}" image exists "$PYTHON_ALIAS" || "${podman[@]}" tag "$PYTHON_IMAGE" "$PYTHON_ALIAS"
    "${podman[@]}" image exists "$EXAMPLES_ALIAS" || "${podman[@]}" tag "$PYTHON_IMAGE" "$EXAMPLES_ALIAS"
    report "$PYTHON_IMAGE" "exists, skipped (--force rebuilds)" "$(since "$t0")"
    return
  fi
  old="$("${podman[@]}" image inspect --format '{{.Id}}' "$PYTHON_IMAGE" 2>/dev/null || true)"
  tarball="$(python_tarball)"
  if [ "$no_cache" = 1 ] || [ ! -s "$tarball" ]; then
    : >"$log"
    make_python_rootfs "$tarball" "$log"
    how="built (debootstrap, rootfs cached)"
  fi
  "${podman[@]}" import -q \
    --change 'CMD ["python3"]' \
    --change "ENV PATH=$PATH_DEBIAN" \
    --change 'WORKDIR /app' \
    "$tarball" "$PYTHON_IMAGE" >/dev/null
  "${podman[@]}" tag "$PYTHON_IMAGE" "$PYTHON_ALIAS"
  "${podman[@]}" tag "$PYTHON_IMAGE" "$EXAMPLES_ALIAS"
  drop_old "$old" "$PYTHON_IMAGE"
  report "$PYTHON_IMAGE" "$how" "$(since "$t0")"
  report "$PYTHON_ALIAS" "tagged as the same image" "-"
  report "$EXAMPLES_ALIAS" "tagged as the same image (the examples' python:3.11)" "-"
}

# An image with an ENTRYPOINT and a CMD of its own, on top of the python image (no RUN
# step: no container runs): for the tests of command/args replacing ENTRYPOINT/CMD.
build_entrypoint() {
  local t0 ctx
  t0="$(now)"
  if [ "$force" = 0 ] && "${podman[@]}" image exists "$ENTRYPOINT_IMAGE"; then
    report "$ENTRYPOINT_IMAGE" "exists, skipped (--force rebuilds)" "$(since "$t0")"
    return
  fi
  ctx="$(mktemp -d)"
  printf '%s\n' "FROM $PYTHON_IMAGE" 'ENTRYPOINT ["python3", "-u"]' \
    'CMD ["-c", "print(\"the image CMD ran\")"]' >"$ctx/Containerfile"
  "${podman[@]}" build -q --pull=never -t "$ENTRYPOINT_IMAGE" "$ctx" >/dev/null
  rm -rf "$ctx"
  report "$ENTRYPOINT_IMAGE" "built on $PYTHON_IMAGE" "$(since "$t0")"
}

if want busybox; then build_busybox; fi
if want python; then build_python; build_entrypoint; fi
