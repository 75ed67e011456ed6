#!/usr/bin/env bash
# Assembles the container image's whole root filesystem in a directory, from
# a sidecache binary built for x86_64-unknown-linux-gnu (dynamically linked
# against glibc) and the glibc of the machine that built it:
#
#   deploy/rootfs.sh target/release/sidecache target/image/rootfs
#
# Both image builds use it: deploy/Dockerfile runs it in its Rust builder
# stage, deploy/image.sh on the host (no registry needed); the result is
# copied into an image FROM scratch. What it holds, and why:
#
#   /usr/local/bin/sidecache    the binary, debug info stripped (symbols kept,
#                               so a panic's backtrace still names functions)
#   /lib64/ld-linux-x86-64.so.2 the loader and the libraries `ldd` names
#   /lib/x86_64-linux-gnu/...   (libc, libm, libgcc_s; libtinfo for bash)
#   /bin/bash                   only for the HEALTHCHECK, which speaks HTTP
#                               to /healthz through bash's /dev/tcp
#   /etc/nsswitch.conf          hosts: files dns — upstream host names (an
#   /etc/hosts                  ElastiCache endpoint, a Compose service) go
#                               through glibc's getaddrinfo; glibc >= 2.34
#                               has its files and dns backends inside libc,
#                               so no libnss_*.so is needed (the check runs
#                               the image's binary under chroot to prove it).
#                               The container runtime mounts its own
#                               /etc/hosts and /etc/resolv.conf over these.
#   /etc/passwd, /etc/group     user and group sidecache, 10001
#   /run/sidecache              for the Unix socket, 0770 (the Dockerfiles
#                               give it to 10001:10001)
#
#   /etc/ssl/certs/ca-certificates.crt
#                               the building machine's CA bundle, read only
#                               by --upstream-iam's AWS credential chain (the
#                               STS call of EKS IRSA is HTTPS, checked
#                               against the system store); left out, with a
#                               warning, when the machine has none
#
# rediss:// itself trusts the Mozilla roots compiled into the binary
# (webpki-roots) plus --tls-ca-file; it reads no system certificate store.
set -euo pipefail

usage() { echo "usage: $0 SIDECACHE_BINARY OUTDIR" >&2; exit 2; }
[ "$#" -eq 2 ] || usage
bin=$1
out=$2
[ -x "$bin" ] || { echo "rootfs: $bin: not an executable" >&2; exit 1; }
glibc_major_minor=$(getconf GNU_LIBC_VERSION | awk '{ print $2 }')
if [ "$(printf '%s\n' 2.34 "$glibc_major_minor" | sort -V | head -1)" != 2.34 ]; then
  echo "rootfs: glibc $glibc_major_minor < 2.34: its NSS backends are separate libraries this script does not copy" >&2
  exit 1
fi

rm -rf "$out"
mkdir -p "$out"/{usr/local/bin,bin,etc,run/sidecache}
chmod 0755 "$out" "$out"/{usr,usr/local,usr/local/bin,bin,etc,run}
chmod 0770 "$out/run/sidecache"

install -m 0755 "$bin" "$out/usr/local/bin/sidecache"
strip --strip-debug "$out/usr/local/bin/sidecache"
install -m 0755 "$(command -v bash)" "$out/bin/bash"

# Every library (and the loader) the two executables load, at the path the
# loader looks for it; symlinks resolved, so the image holds plain files.
for exe in "$out/usr/local/bin/sidecache" "$out/bin/bash"; do
  if ! deps=$(ldd "$exe"); then
    echo "rootfs: ldd $exe failed (not a dynamically linked glibc executable?)" >&2
    exit 1
  fi
  while read -r lib; do
    [ -e "$out$lib" ] && continue
    mkdir -p "$out$(dirname "$lib")"
    install -m 0755 "$(readlink -f "$lib")" "$out$lib"
  done < <(awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' <<<"$deps")
done

cat >"$out/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/usr/sbin/nologin
sidecache:x:10001:10001:sidecache:/nonexistent:/usr/sbin/nologin
EOF
cat >"$out/etc/group" <<'EOF'
root:x:0:
sidecache:x:10001:
EOF
cat >"$out/etc/nsswitch.conf" <<'EOF'
passwd: files
group:  files
hosts:  files dns
EOF
cat >"$out/etc/hosts" <<'EOF'
127.0.0.1 localhost
::1       localhost ip6-localhost ip6-loopback
EOF
chmod 0644 "$out"/etc/*
bundle=/etc/ssl/certs/ca-certificates.crt
if [ -f "$bundle" ]; then
  mkdir -p "$out/etc/ssl/certs"
  chmod 0755 "$out/etc/ssl" "$out/etc/ssl/certs"
  install -m 0644 "$(readlink -f "$bundle")" "$out$bundle"
else
  echo "rootfs: no $bundle here: --upstream-iam with EKS IRSA will not reach STS" >&2
fi

du -sh "$out" | awk '{ print "rootfs: " $1 " in " $2 }'
