#!/usr/bin/env bash
# Prepare a cached aarch64 (Debian bookworm arm64) user space for the tests in
# tests/emulation: Debian's python3.11 and PoCL unpacked into a sysroot that is
# entered with chroot + qemu-user, plus aarch64 wheels installed with the
# host's pip.  Nothing is installed into the host's dpkg database except the
# host tools (qemu-user-static, gcc) when they are missing.
#
#   bash tests/emulation/prepare_aarch64.sh
#
# Layout under ${EDGECV_AARCH64_ROOT:-$HOME/.cache/edgecv/aarch64}:
#   apt/            private apt configuration, lists and downloaded .debs
#   sysroot/        the unpacked arm64 packages (the chroot)
#   site-packages/  aarch64 wheels (bind-mounted at the same path in the chroot)
#   pocl-cache/     PoCL's compiled-kernel cache (POCL_CACHE_DIR)
#   READY           written last; its last line is the layout version
#
# Every step checks whether its result is already there, so a second run
# downloads nothing and finishes in seconds.
set -euo pipefail

# Bump when the layout or the content changes in a way the stamps do not see;
# tests/emulation/aarch64.py expects the same value.
LAYOUT_VERSION="edgecv-aarch64-userspace 1"

ROOT=${EDGECV_AARCH64_ROOT:-$HOME/.cache/edgecv/aarch64}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
SYSROOT=$ROOT/sysroot
APTDIR=$ROOT/apt
SITE=$ROOT/site-packages
QEMU=/usr/bin/qemu-aarch64-static
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg

# Debian arm64 packages; apt adds their dependency closure.  libpocl2 depends
# on clang-15, which brings binutils (the linker PoCL's in-process clang
# driver runs), libgcc-12-dev and libc6-dev (crt files, libgcc).
DEB_PACKAGES=(python3.11 pocl-opencl-icd ocl-icd-libopencl1)

# aarch64 programs that PoCL starts with execve(); each one is moved to
# /usr/libexec/edgecv-aarch64/ and replaced by a static x86-64 wrapper that
# runs it under qemu-user (there is no binfmt_misc, so the kernel refuses an
# aarch64 execve with ENOEXEC).  PoCL 3.1 compiles kernels in-process with
# libclang-cpp15 and links the kernel .so through the in-process clang driver,
# which runs /usr/bin/ld (-> aarch64-linux-gnu-ld -> aarch64-linux-gnu-ld.bfd);
# that is the only program it executes (checked with strace -f -e execve).
# python3.11 is wrapped too: tests/emulation/aarch64.py starts /usr/bin/python3.11
# directly, and guest code can run sys.executable in a subprocess.
WRAPPED_PROGRAMS=(/usr/bin/aarch64-linux-gnu-ld.bfd /usr/bin/python3.11)
WRAPPED_DIR=/usr/libexec/edgecv-aarch64

WHEELS=(numpy==1.26.4 apache-tvm-ffi==0.1.14.post0 pyopencl==2026.1.4)
PIP_PLATFORMS=(manylinux_2_28_aarch64 manylinux2014_aarch64 manylinux_2_17_aarch64)

if [[ -n ${EDGECV_HOST_PYTHON:-} ]]; then
    HOST_PY=$EDGECV_HOST_PYTHON
elif [[ -x $REPO/.venv/bin/python ]]; then
    HOST_PY=$REPO/.venv/bin/python
else
    HOST_PY=python3
fi

log() { printf '[aarch64] %s\n' "$*"; }
die() { printf '[aarch64] error: %s\n' "$*" >&2; exit 1; }

# Replace $1 with the content of stdin only when it differs; returns 0 when
# the file changed.
write_if_changed() {
    local target=$1 tmp
    tmp=$(mktemp "$target.XXXXXX")
    cat >"$tmp"
    if [[ -f $target ]] && cmp -s "$tmp" "$target"; then
        rm -f "$tmp"
        return 1
    fi
    mv "$tmp" "$target"
    return 0
}

# Is the stamp file $1 present with exactly the content $2?
stamp_ok() { [[ -f $1 ]] && [[ "$(cat "$1")" == "$2" ]]; }

start=$SECONDS
mkdir -p "$ROOT"
exec 9>"$ROOT/.lock"
flock 9 # one preparation at a time

# --- 1. host tools ----------------------------------------------------------
host_pkgs=()
[[ -x $QEMU ]] || host_pkgs+=(qemu-user-static)
if ! command -v gcc >/dev/null 2>&1; then
    host_pkgs+=(gcc libc6-dev)
elif [[ ! -e $(gcc -print-file-name=libc.a) ]]; then
    host_pkgs+=(libc6-dev) # gcc -static needs libc.a
fi
if ((${#host_pkgs[@]})); then
    [[ $EUID -eq 0 ]] || die "missing host packages ${host_pkgs[*]}; install them as root"
    log "installing host packages: ${host_pkgs[*]}"
    apt-get update && apt-get install -y --no-install-recommends "${host_pkgs[@]}"
else
    log "host tools present (qemu-aarch64-static, gcc)"
fi
for tool in unshare chroot mount dpkg-deb apt-get flock; do
    command -v "$tool" >/dev/null 2>&1 || die "host tool '$tool' not found"
done
[[ -r $KEYRING ]] || die "$KEYRING missing (package debian-archive-keyring)"

# --- 2. private apt configuration for arm64 ----------------------------------
# Same mirrors and bookworm suites as the host's own sources.
host_debian_sources() {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -r $f ]] || continue
        awk '
            function flush() {
                if (types ~ /(^| )deb( |$)/ && enabled != "no")
                    for (i = 1; i <= nu; i++) for (j = 1; j <= ns; j++)
                        print u[i], s[j]
                types = ""; enabled = ""; nu = 0; ns = 0
            }
            /^[ \t]*$/ { flush(); next }
            /^[ \t]*#/ { next }
            tolower($1) == "types:"   { types = $0 }
            tolower($1) == "enabled:" { enabled = tolower($2) }
            tolower($1) == "uris:"    { for (k = 2; k <= NF; k++) u[++nu] = $k }
            tolower($1) == "suites:"  { for (k = 2; k <= NF; k++) s[++ns] = $k }
            END { flush() }' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -r $f ]] || continue
        sed -e 's/\[[^]]*\]//' "$f" | awk '$1 == "deb" { print $2, $3 }'
    done
}
mapfile -t sources < <(host_debian_sources | awk '$2 ~ /^bookworm(-updates|-security)?$/' | sed 's:/*  *: :' | sort -u)
if ((${#sources[@]} == 0)); then
    sources=("http://deb.debian.org/debian bookworm" "http://deb.debian.org/debian bookworm-updates"
        "http://deb.debian.org/debian-security bookworm-security")
fi

mkdir -p "$APTDIR"/etc/apt.conf.d "$APTDIR"/etc/preferences.d "$APTDIR"/etc/sources.list.d \
    "$APTDIR"/state/lists/partial "$APTDIR"/cache/archives/partial
[[ -f $APTDIR/state/status ]] || : >"$APTDIR/state/status" # nothing "installed"
for src in "${sources[@]}"; do
    printf 'deb [arch=arm64 signed-by=%s] %s main\n' "$KEYRING" "$src"
done | write_if_changed "$APTDIR/etc/sources.list" || true

# Only this file is read (Dir::Etc::Parts is an empty folder): the host's
# apt.conf.d hooks and its dpkg state are left alone.  Proxy settings and the
# Check-Valid-Until/Check-Date relaxations are taken over from the host.
{
    cat <<EOF
Dir::Etc "$APTDIR/etc";
Dir::Etc::main "/dev/null";
Dir::Etc::Parts "$APTDIR/etc/apt.conf.d";
Dir::Etc::SourceList "$APTDIR/etc/sources.list";
Dir::Etc::SourceParts "$APTDIR/etc/sources.list.d";
Dir::Etc::Preferences "$APTDIR/etc/preferences";
Dir::Etc::PreferencesParts "$APTDIR/etc/preferences.d";
Dir::State "$APTDIR/state";
Dir::State::status "$APTDIR/state/status";
Dir::Cache "$APTDIR/cache";
Dir::Log "$APTDIR/log";
APT::Architecture "arm64";
APT::Architectures { "arm64"; };
APT::Install-Recommends "false";
APT::Install-Suggests "false";
APT::Sandbox::User "root";
Acquire::Languages "none";
EOF
    apt-config dump 2>/dev/null | grep -E '^Acquire::(https?|ftp)::Proxy|^Acquire::Check-(Valid-Until|Date) ' || true
} | write_if_changed "$APTDIR/apt.conf" || true
export APT_CONFIG=$APTDIR/apt.conf

update_key=$(cat "$APTDIR/apt.conf" "$APTDIR/etc/sources.list")
if stamp_ok "$APTDIR/update.stamp" "$update_key"; then
    log "apt lists for arm64 present"
else
    log "apt-get update (arm64, private state in $APTDIR)"
    apt-get -q update >"$APTDIR/update.log" 2>&1 || { cat "$APTDIR/update.log" >&2; die "apt-get update failed"; }
    rm -f "$APTDIR/manifest.stamp"
    printf '%s' "$update_key" >"$APTDIR/update.stamp"
fi

# --- 3. resolve and download the package closure -----------------------------
# manifest.txt: "package version arch", one line per .deb of the closure.
manifest_key="${DEB_PACKAGES[*]}"
if stamp_ok "$APTDIR/manifest.stamp" "$manifest_key" && [[ -s $APTDIR/manifest.txt ]]; then
    log "package closure resolved ($(wc -l <"$APTDIR/manifest.txt") packages)"
else
    apt-get install -s -y "${DEB_PACKAGES[@]}" >"$APTDIR/resolve.log" 2>&1 ||
        { cat "$APTDIR/resolve.log" >&2; die "cannot resolve ${DEB_PACKAGES[*]}"; }
    sed -n 's/^Inst \([^ ]*\) (\([^ ]*\) .*\[\([a-z0-9]*\)\]).*$/\1 \2 \3/p' "$APTDIR/resolve.log" |
        sort >"$APTDIR/manifest.txt"
    [[ -s $APTDIR/manifest.txt ]] || die "empty package closure, see $APTDIR/resolve.log"
    printf '%s' "$manifest_key" >"$APTDIR/manifest.stamp"
    log "package closure resolved ($(wc -l <"$APTDIR/manifest.txt") packages)"
fi

deb_files=()
missing=0
while read -r pkg ver arch; do
    f=$APTDIR/cache/archives/${pkg}_${ver//:/%3a}_${arch}.deb
    deb_files+=("$f")
    [[ -f $f ]] || missing=$((missing + 1))
done <"$APTDIR/manifest.txt"
if ((missing == 0)); then
    log "all ${#deb_files[@]} .deb files cached"
else
    log "downloading $missing arm64 .deb files"
    apt-get install -q -y --download-only "${DEB_PACKAGES[@]}" >"$APTDIR/download.log" 2>&1 ||
        { tail -n 30 "$APTDIR/download.log" >&2; die "download failed"; }
    for f in "${deb_files[@]}"; do
        [[ -f $f ]] || die "expected $f after the download"
    done
fi

# --- 4. unpack into the sysroot ----------------------------------------------
if stamp_ok "$SYSROOT/.edgecv/manifest.txt" "$(cat "$APTDIR/manifest.txt")"; then
    log "sysroot unpacked"
else
    log "unpacking ${#deb_files[@]} packages into $SYSROOT"
    rm -rf "$ROOT/sysroot.partial"
    mkdir -p "$ROOT/sysroot.partial"
    printf '%s\0' "${deb_files[@]}" |
        xargs -0 -n 4 -P "$(nproc)" sh -c 'for d; do dpkg-deb -x "$d" "$0" || exit 255; done' "$ROOT/sysroot.partial"
    mkdir -p "$ROOT/sysroot.partial/.edgecv"
    cp "$APTDIR/manifest.txt" "$ROOT/sysroot.partial/.edgecv/manifest.txt"
    rm -rf "$SYSROOT"
    mv "$ROOT/sysroot.partial" "$SYSROOT"
fi

# --- 5. make the sysroot runnable under chroot + qemu-user -------------------
mkdir -p "$SYSROOT"/{proc,dev,sys,tmp,root,etc} "$SYSROOT$WRAPPED_DIR"
chmod 1777 "$SYSROOT/tmp"
if ! cmp -s "$QEMU" "$SYSROOT$QEMU"; then
    log "copying qemu-aarch64-static into the sysroot"
    install -m 0755 "$QEMU" "$SYSROOT$QEMU"
fi

wrapper_src=$HERE/qemu_exec_wrapper.c
wrapper_key="$(sha256sum <"$wrapper_src") ${WRAPPED_PROGRAMS[*]}"
if stamp_ok "$SYSROOT/.edgecv/wrappers.stamp" "$wrapper_key"; then
    log "exec wrappers in place (${WRAPPED_PROGRAMS[*]})"
else
    for prog in "${WRAPPED_PROGRAMS[@]}"; do
        real=$WRAPPED_DIR/$(basename "$prog")
        [[ -L $SYSROOT$prog ]] && die "$prog is a symlink; list the file it points to instead"
        if [[ ! -e $SYSROOT$real ]]; then
            [[ -f $SYSROOT$prog ]] || die "$prog not found in the sysroot"
            mv "$SYSROOT$prog" "$SYSROOT$real"
        fi
        log "wrapping $prog -> qemu-aarch64-static $real"
        gcc -static -O2 -Wall -DTARGET_PROGRAM="\"$real\"" -o "$SYSROOT$prog.tmp" "$wrapper_src"
        mv "$SYSROOT$prog.tmp" "$SYSROOT$prog"
    done
    printf '%s' "$wrapper_key" >"$SYSROOT/.edgecv/wrappers.stamp"
fi

icd=$SYSROOT/etc/OpenCL/vendors/pocl.icd
if [[ ! -s $icd ]]; then
    log "writing /etc/OpenCL/vendors/pocl.icd"
    mkdir -p "$(dirname "$icd")"
    echo "libpocl.so.2" >"$icd"
fi

# Byte-compile the stdlib with the host's CPython 3.11 (same .pyc format), so
# the emulated interpreter does not have to compile it on first import.
if [[ -f $SYSROOT/.edgecv/pyc.stamp ]]; then
    log "stdlib byte-compiled"
else
    log "byte-compiling the sysroot's stdlib with $HOST_PY"
    "$HOST_PY" -m compileall -q -j 0 -s "$SYSROOT" -p / "$SYSROOT/usr/lib/python3.11" >"$ROOT/compileall.log" 2>&1 ||
        log "compileall reported errors (see $ROOT/compileall.log); continuing"
    touch "$SYSROOT/.edgecv/pyc.stamp"
fi

# --- 6. aarch64 wheels ------------------------------------------------------
pip_key="${WHEELS[*]} | ${PIP_PLATFORMS[*]}"
if stamp_ok "$SITE/.edgecv-requirements" "$pip_key"; then
    log "aarch64 wheels installed in $SITE"
else
    log "installing aarch64 wheels: ${WHEELS[*]}"
    platform_args=()
    for p in "${PIP_PLATFORMS[@]}"; do platform_args+=(--platform "$p"); done
    rm -rf "$ROOT/site-packages.partial"
    "$HOST_PY" -m pip install -q --disable-pip-version-check --no-warn-script-location \
        --target "$ROOT/site-packages.partial" --only-binary=:all: "${platform_args[@]}" \
        --python-version 3.11 --implementation cp "${WHEELS[@]}" \
        2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
    printf '%s' "$pip_key" >"$ROOT/site-packages.partial/.edgecv-requirements"
    rm -rf "$SITE"
    mv "$ROOT/site-packages.partial" "$SITE"
fi

mkdir -p "$ROOT/pocl-cache"

# --- 7. smoke test and READY -------------------------------------------------
ready_key="$LAYOUT_VERSION"
ready_ok=false
if [[ -f $ROOT/READY ]] && [[ "$(tail -n 1 "$ROOT/READY")" == "$ready_key" ]]; then
    ready_ok=true
    for f in "$SYSROOT/.edgecv/manifest.txt" "$SYSROOT/.edgecv/wrappers.stamp" "$SITE/.edgecv-requirements"; do
        [[ $ROOT/READY -nt $f ]] || ready_ok=false
    done
fi
if $ready_ok; then
    log "READY is up to date"
else
    rm -f "$ROOT/READY"
    log "smoke test: emulated python3.11"
    machine=$(EDGECV_AARCH64_ROOT=$ROOT "$HOST_PY" "$HERE/aarch64.py" -c 'import platform; print(platform.machine())')
    [[ $machine == aarch64 ]] || die "smoke test printed '$machine', expected aarch64"
    {
        echo "created: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
        echo "debian sources: ${sources[*]}"
        echo "debian packages: ${DEB_PACKAGES[*]} ($(wc -l <"$APTDIR/manifest.txt") in the closure, see sysroot/.edgecv/manifest.txt)"
        echo "wheels: ${WHEELS[*]}"
        echo "$ready_key"
    } >"$ROOT/READY.tmp"
    mv "$ROOT/READY.tmp" "$ROOT/READY"
fi

log "done in $((SECONDS - start)) s: sysroot $(du -sh "$SYSROOT" | cut -f1), site-packages $(du -sh "$SITE" | cut -f1) ($ROOT)"
