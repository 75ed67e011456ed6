#!/usr/bin/env python3
"""Checks of the container image, for deploy/check.sh. No container is
started (this machine cannot); the image's own root filesystem is used
under chroot instead, which runs the image's loader, libc and binary.

    image.py config INSPECT.json
        The image's configuration: user, entrypoint, command, port, stop
        signal, health check, size.
    image.py run ROOTFS INSPECT.json OUT_DIR [RENDERED_K8S.yaml]
        As root, inside network and mount namespaces of its own
        (`unshare --net --mount`):
        runs the image's binary from ROOTFS the way each deployment file
        starts it, against real redis-servers on loopback, and checks that
        it serves and that the probes those files name answer. Leaves
        --help's text in OUT_DIR/help.txt and a /metrics scrape taken after
        traffic in OUT_DIR/metrics.txt.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import yaml

MAX_IMAGE_BYTES = 25 * 1024 * 1024
USER = "10001:10001"
CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def ok(msg):
    print(f"ok   {msg}", flush=True)
    if os.environ.get("DEPLOY_CHECK_TALLY"):
        with open(os.environ["DEPLOY_CHECK_TALLY"], "a") as f:
            f.write("\n")


def load_inspect(path):
    with open(path) as f:
        data = json.load(f)
    if isinstance(data, list):
        data = data[0]
    cfg = data.get("Config") or {}
    # podman keeps the health check beside Config, docker inside it.
    health = cfg.get("Healthcheck") or data.get("Healthcheck")
    return data, cfg, health


def check_config(inspect_path):
    data, cfg, health = load_inspect(inspect_path)
    want = {
        "User": USER,
        "Entrypoint": ["/usr/local/bin/sidecache"],
        "Cmd": ["--listen", "0.0.0.0:6380", "--protected-mode", "no"],
        "StopSignal": "SIGTERM",
    }
    for key, value in want.items():
        if cfg.get(key) != value:
            fail(f"image config {key} is {cfg.get(key)!r}, want {value!r}")
    ok(f"runs {cfg['Entrypoint'] + cfg['Cmd']} as {cfg['User']}, stop signal {cfg['StopSignal']}")
    if "6380/tcp" not in (cfg.get("ExposedPorts") or {}):
        fail(f"6380/tcp not exposed: {cfg.get('ExposedPorts')}")
    ok("exposes 6380/tcp")
    if not health or not health.get("Test"):
        fail("no health check (podman drops it unless it builds with --format docker)")
    test = health["Test"]
    if test[0] != "CMD" or "/healthz" not in " ".join(test) or "9121" not in " ".join(test):
        fail(f"health check {test!r} is not an exec-form probe of 127.0.0.1:9121/healthz")
    ok(f"health check {test[:2]} … probes /healthz on 9121")
    size = int(data["Size"])
    if size > MAX_IMAGE_BYTES:
        fail(f"image is {size} bytes, more than {MAX_IMAGE_BYTES}")
    ok(f"size {size} bytes ({size / 1024 / 1024:.1f} MiB) <= 25 MiB")


# --- running the image's binary under chroot ------------------------------------

class Run:
    """Processes started here, ended by pid."""

    def __init__(self, root, out):
        self.root = root
        self.out = out
        self.procs = []

    def start(self, name, argv, env=None, user=None):
        """Starts argv on the host, or under chroot in the image's root
        filesystem as `user` (uid:gid) when one is given."""
        log = open(os.path.join(self.out, f"{name}.log"), "w")
        if user is not None:
            argv = [CHROOT, f"--userspec={user}", self.root] + argv
        p = subprocess.Popen(argv, env=env if env is not None else {"PATH": "/usr/bin:/bin"},
                             stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        p.name = name
        p.logfile = log.name
        self.procs.append(p)
        return p

    def stop(self, p, timeout=20):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        try:
            return p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            fail(f"{p.name} did not stop within {timeout} s of SIGTERM: {tail(p)}")

    def stop_all(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.kill()
                p.wait()


def tail(p):
    with open(p.logfile) as f:
        return "\n" + "".join(f.readlines()[-15:])


def cli(*args, port=None, sock=None):
    where = ["-s", sock] if sock else ["-p", str(port)]
    r = subprocess.run(["redis-cli", *where, *args], capture_output=True, text=True, timeout=10)
    return r.stdout.strip()


def http(port, path, host="127.0.0.1"):
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=3) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return None, str(e)


def health_argv(health):
    test = health["Test"]
    if test[0] == "CMD":
        return test[1:]
    if test[0] == "CMD-SHELL":
        return ["/bin/sh", "-c", test[1]]
    fail(f"health check {test!r}")


def healthy(run, health, user):
    r = subprocess.run([CHROOT, f"--userspec={user}", run.root, *health_argv(health)],
                       env={"PATH": "/usr/local/bin:/bin"}, capture_output=True, timeout=10)
    return r.returncode == 0


def wait_for(what, cond, proc, timeout=15):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        if proc is not None and proc.poll() is not None:
            fail(f"{proc.name} exited with {proc.returncode} while waiting for {what}: {tail(proc)}")
        time.sleep(0.2)
    fail(f"{what}: not within {timeout} s" + (tail(proc) if proc else ""))


def serves(name, port=None, sock=None, upstream_port=6379, upstream_tls=None):
    key = f"check:{name}:{'unix' if sock else 'tcp'}"
    if cli("SET", key, "v1", port=port, sock=sock) != "OK":
        fail(f"{name}: SET through sidecache failed")
    if cli("GET", key, port=port, sock=sock) != "v1":
        fail(f"{name}: GET through sidecache did not return the value")
    # Written behind: the upstream has it soon after.
    up = (lambda: cli("GET", key, port=upstream_port)) if upstream_tls is None else upstream_tls(key)
    deadline = time.monotonic() + 10
    while up() != "v1":
        if time.monotonic() > deadline:
            fail(f"{name}: the write did not reach the upstream")
        time.sleep(0.1)


def env_with(base, **extra):
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    env.update(base)
    env.update(extra)
    return env


def scenario_image(run, cfg, health, out):
    """The image as built: its entrypoint and command, as its user, upstream
    by host name (localhost: /etc/hosts through nsswitch's `files`)."""
    # SIDECACHE_PREFIX_STATS: the per-prefix series the dashboard reads
    # exist only with it.
    env = env_with({}, SIDECACHE_UPSTREAM="redis://localhost:6379",
                   SIDECACHE_UNIX_SOCKET="/run/sidecache/sidecache.sock",
                   SIDECACHE_PREFIX_STATS="check:")
    p = run.start("image-default", cfg["Entrypoint"] + cfg["Cmd"], env=env, user=cfg["User"])
    wait_for("the image's health check", lambda: healthy(run, health, cfg["User"]), p)
    ok("image's own entrypoint/command as 10001: health check passes")
    serves("image", port=6380)
    ok("serves SET/GET on 0.0.0.0:6380, write reaches redis://localhost:6379")
    sock = os.path.join(run.root, "run/sidecache/sidecache.sock")
    serves("image", sock=sock)
    st = os.stat(sock)
    if (st.st_uid, st.st_gid) != (10001, 10001) or st.st_mode & 0o777 != 0o660:
        fail(f"socket owned {st.st_uid}:{st.st_gid} mode {oct(st.st_mode & 0o777)}")
    ok("serves on /run/sidecache/sidecache.sock (10001:10001, 0660): the image's socket directory is writable")
    # Traffic that fills the series the dashboard reads: hits, misses (of
    # the check: prefix and of other keys), an error reply, an upstream
    # command.
    cli("GET", "check:image:tcp", port=6380)
    cli("GET", "check:missing", port=6380)
    cli("INCR", "check:image:tcp", port=6380)
    cli("HSET", "check:h", "f", "v", port=6380)
    cli("PING", port=6380)
    status, body = http(9121, "/readyz")
    if status != 200:
        fail(f"/readyz: {status} {body}")
    status, metrics = http(9121, "/metrics")
    if status != 200 or "sidecache_ready 1" not in metrics:
        fail(f"/metrics: {status}")
    with open(os.path.join(out, "metrics.txt"), "w") as f:
        f.write(metrics)
    ok("/readyz 200, /metrics scraped")
    code = run.stop(p)
    if code != 0:
        fail(f"exit status {code} after SIGTERM: {tail(p)}")
    ok("SIGTERM: drained and exited 0")
    if healthy(run, health, cfg["User"]):
        fail("the health check passes with sidecache stopped")
    ok("health check fails once it is stopped")


def scenario_dns(run, cfg):
    """Upstream by a name only a DNS server knows (as an ElastiCache
    endpoint): getaddrinfo through nsswitch's `dns` and resolv.conf."""
    resolv = os.path.join(run.root, "etc/resolv.conf")
    with open(resolv, "w") as f:
        f.write("nameserver 127.0.0.53\noptions timeout:1 attempts:2\n")
    dns = run.start("dns", [sys.executable, os.path.join(REPO, "deploy/checks/dns.py"),
                            "127.0.0.53", "redis.sidecache.test=127.0.0.1"],
                    env=dict(os.environ))
    time.sleep(0.3)
    env = env_with({}, SIDECACHE_UPSTREAM="redis://redis.sidecache.test:6379")
    p = run.start("image-dns", cfg["Entrypoint"] + cfg["Cmd"], env=env, user=cfg["User"])
    wait_for("/readyz with a DNS-resolved upstream", lambda: http(9121, "/readyz")[0] == 200, p)
    serves("dns", port=6380)
    if run.stop(p) != 0:
        fail(f"exit status after SIGTERM: {tail(p)}")
    with open(dns.logfile) as f:
        if "asked" not in f.read():
            fail("the DNS server was never asked")
    ok("upstream redis://redis.sidecache.test:6379 resolved by a DNS server through the image's libc; served")
    run.stop(dns)
    os.remove(resolv)


def scenario_tls(run, cfg, tls_dir):
    """rediss:// with the image's TLS (rustls, no system CA store) and a
    private CA given by --tls-ca-file."""
    inside = os.path.join(run.root, "check")
    os.makedirs(inside, exist_ok=True)
    shutil.copy(os.path.join(tls_dir, "ca.pem"), os.path.join(inside, "ca.pem"))
    os.chmod(os.path.join(inside, "ca.pem"), 0o644)
    env = env_with({}, SIDECACHE_UPSTREAM="rediss://localhost:6390",
                   SIDECACHE_TLS_CA_FILE="/check/ca.pem")
    p = run.start("image-tls", cfg["Entrypoint"] + cfg["Cmd"], env=env, user=cfg["User"])
    wait_for("/readyz with a rediss:// upstream", lambda: http(9121, "/readyz")[0] == 200, p)

    def tls_get(key):
        return lambda: subprocess.run(
            ["redis-cli", "--tls", "--cacert", os.path.join(tls_dir, "ca.pem"), "-p", "6390", "GET", key],
            capture_output=True, text=True, timeout=10).stdout.strip()
    serves("tls", port=6380, upstream_tls=tls_get)
    if run.stop(p) != 0:
        fail(f"exit status after SIGTERM: {tail(p)}")
    ok("upstream rediss://localhost:6390 (private CA via --tls-ca-file): served over TLS")
    shutil.rmtree(inside)


def mount(*args):
    r = subprocess.run(["mount", *args], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"mount {' '.join(args)}: {r.stderr.strip()}")


def umount(path):
    subprocess.run(["umount", path], check=True)


def k8s_sidecar(rendered):
    docs = [d for d in yaml.safe_load_all(open(rendered)) if d]
    dep = next(d for d in docs if d["kind"] == "Deployment")
    pod = dep["spec"]["template"]["spec"]
    sc = next(c for c in pod["initContainers"] if c["name"] == "sidecache")
    return pod, sc


def scenario_kubernetes(run, cfg, rendered):
    """The sidecar container of the Kubernetes manifest: the image's
    entrypoint with the manifest's args and env, as its runAsUser, and
    its three probes against the port they name."""
    pod, sc = k8s_sidecar(rendered)
    args = sc.get("args", cfg["Cmd"])
    argv = sc.get("command", cfg["Entrypoint"]) + args
    env = {}
    for e in sc.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        elif e["name"] == "SIDECACHE_UPSTREAM":
            env[e["name"]] = "redis://localhost:6379"  # the Secret's value, here
        else:
            fail(f"env {e['name']} from {e.get('valueFrom')}: the check cannot stand in for it")
    sec = sc["securityContext"]
    user = f"{sec['runAsUser']}:{sec['runAsGroup']}"
    # The pod's view of the file system: the image read-only when the
    # manifest says so, the shared emptyDir a writable tmpfs of group
    # fsGroup (this runs in a mount namespace of its own).
    mount_path = next(m["mountPath"] for m in sc["volumeMounts"] if m["name"] == "sidecache-run")
    volume = os.path.join(run.root, mount_path.lstrip("/"))
    if sec.get("readOnlyRootFilesystem"):
        mount("--bind", run.root, run.root)
        mount("-o", "remount,bind,ro", run.root)
    mount("-t", "tmpfs", "-o", f"mode=2777,gid={pod['securityContext']['fsGroup']}", "tmpfs", volume)
    p = run.start("kubernetes", argv, env=env_with(env), user=user)
    ports = {pt["name"]: pt["containerPort"] for pt in sc.get("ports", [])}
    for probe in ["startupProbe", "livenessProbe", "readinessProbe"]:
        get = sc[probe]["httpGet"]
        port = ports.get(get["port"], get["port"])
        # The kubelet probes the pod IP; in this namespace 127.0.0.2 stands
        # for an address that is not the loopback one sidecache defaults to.
        wait_for(f"{probe} GET :{port}{get['path']}",
                 lambda: http(port, get["path"], host="127.0.0.2")[0] == 200, p)
        ok(f"kubernetes {probe}: GET {get['path']} on {get['port']} ({port}) answers 200 on a non-loopback-default address")
    sock = env.get("SIDECACHE_UNIX_SOCKET", "")
    if not sock.startswith(mount_path + "/"):
        fail(f"socket {sock} is not on the shared volume {mount_path}")
    serves("kubernetes", port=6380)
    serves("kubernetes", sock=os.path.join(run.root, sock.lstrip("/")))
    ok(f"kubernetes: serves on 127.0.0.1:6380 and {sock} (the volume shared with the app)"
       + (", image mounted read-only" if sec.get("readOnlyRootFilesystem") else ""))
    if run.stop(p) != 0:
        fail(f"exit status after SIGTERM: {tail(p)}")
    umount(volume)
    if sec.get("readOnlyRootFilesystem"):
        umount(run.root)


def scenario_compose(run, cfg, health):
    """The sidecache service of compose.yaml: the image's entrypoint with
    the service's command and environment (upstream made local), its
    health check from the image."""
    comp = yaml.safe_load(open(os.path.join(REPO, "deploy/compose.yaml")))
    svc = comp["services"]["sidecache"]
    env = {k: str(v) for k, v in svc.get("environment", {}).items()}
    env["SIDECACHE_UPSTREAM"] = "redis://localhost:6379"
    argv = svc.get("entrypoint", cfg["Entrypoint"]) + svc.get("command", cfg["Cmd"])
    user = svc.get("user", cfg["User"])
    # The socket volume as compose.yaml defines it (a tmpfs with its options).
    volume = None
    for v in svc.get("volumes", []):
        name, target = v.split(":")[:2]
        opts = (comp.get("volumes", {}).get(name) or {}).get("driver_opts", {})
        if opts.get("type") == "tmpfs":
            volume = os.path.join(run.root, target.lstrip("/"))
            mount("-t", "tmpfs", "-o", opts["o"], opts.get("device", "tmpfs"), volume)
    p = run.start("compose", argv, env=env_with(env), user=user)
    wait_for("the image's health check with compose's settings", lambda: healthy(run, health, user), p)
    serves("compose", port=6380)
    serves("compose", sock=os.path.join(run.root, env["SIDECACHE_UNIX_SOCKET"].lstrip("/")))
    ok("compose: health check passes, serves on 127.0.0.1:6380 and the socket"
       + (" (on the tmpfs volume as compose.yaml mounts it)" if volume else ""))
    if run.stop(p) != 0:
        fail(f"exit status after SIGTERM: {tail(p)}")
    if volume:
        umount(volume)


def scenario_systemd(run, cfg):
    """The systemd unit's ExecStart, with the binary and the example TOML
    installed where the unit's header says (the TOML's upstream is
    redis://127.0.0.1:6379)."""
    unit = open(os.path.join(REPO, "deploy/sidecache.service")).read()
    exec_start = next(l.split("=", 1)[1] for l in unit.splitlines() if l.startswith("ExecStart="))
    argv = exec_start.split()
    installed = dict((src, dst) for src, dst in
                     re.findall(r"^#\s+install -m \d+ (\S+) (\S+)$", unit, re.M))
    if installed.get("target/release/sidecache") != argv[0]:
        fail(f"the unit's header installs the binary as {installed.get('target/release/sidecache')}, "
             f"ExecStart runs {argv[0]}")
    if argv[0] != cfg["Entrypoint"][0]:
        fail(f"ExecStart runs {argv[0]}, the image's binary is {cfg['Entrypoint'][0]}")
    conf = installed.get("deploy/sidecache.toml.example")
    if not conf:
        fail("the unit's header does not say where sidecache.toml.example goes")
    dst = os.path.join(run.root, conf.lstrip("/"))
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.copy(os.path.join(REPO, "deploy/sidecache.toml.example"), dst)
    os.chmod(dst, 0o644)
    p = run.start("systemd", argv, env=env_with({}), user=USER)
    wait_for("/readyz with sidecache.toml.example", lambda: http(9121, "/readyz")[0] == 200, p)
    serves("systemd", port=6380)
    serves("systemd", sock=os.path.join(run.root, "run/sidecache/sidecache.sock"))
    ok(f"systemd: `{exec_start}`, with sidecache.toml.example installed as the unit's header says, "
       "serves on 127.0.0.1:6380 and the socket")
    if run.stop(p) != 0:
        fail(f"exit status after SIGTERM: {tail(p)}")
    shutil.rmtree(os.path.dirname(dst))


def make_tls(d):
    """A private CA and a certificate for `localhost` signed by it."""
    def ssl(*a):
        subprocess.run(["openssl", *a], check=True, capture_output=True)
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    ssl("req", "-x509", *key, "-days", "1", "-subj", "/CN=sidecache check CA",
        "-keyout", f"{d}/ca.key", "-out", f"{d}/ca.pem")
    ssl("req", *key, "-subj", "/CN=localhost", "-keyout", f"{d}/server.key", "-out", f"{d}/server.csr")
    with open(f"{d}/ext.cnf", "w") as f:
        f.write("subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
    ssl("x509", "-req", "-in", f"{d}/server.csr", "-CA", f"{d}/ca.pem", "-CAkey", f"{d}/ca.key",
        "-CAcreateserial", "-days", "1", "-extfile", f"{d}/ext.cnf", "-out", f"{d}/server.pem")


def run_all(root, inspect_path, out, rendered):
    if os.geteuid() != 0:
        fail("needs root (chroot)")
    _, cfg, health = load_inspect(inspect_path)
    run = Run(root, out)
    try:
        tls = os.path.join(out, "tls")
        os.makedirs(tls, exist_ok=True)
        make_tls(tls)
        redis = ["redis-server", "--save", "", "--appendonly", "no", "--bind", "127.0.0.1"]
        run.start("redis", redis + ["--port", "6379", "--dir", out], env=dict(os.environ))
        run.start("redis-tls", redis + ["--port", "0", "--tls-port", "6390", "--dir", out,
                                        "--tls-cert-file", f"{tls}/server.pem",
                                        "--tls-key-file", f"{tls}/server.key",
                                        "--tls-ca-cert-file", f"{tls}/ca.pem",
                                        "--tls-auth-clients", "no"], env=dict(os.environ))
        wait_for("redis-server", lambda: cli("PING", port=6379) == "PONG", None)

        version = subprocess.run([CHROOT, f"--userspec={USER}", root, "/usr/local/bin/sidecache", "--version"],
                                 capture_output=True, text=True, timeout=10)
        want = re.search(r'^version = "([^"]+)"', open(os.path.join(REPO, "Cargo.toml")).read(), re.M).group(1)
        if version.returncode != 0 or version.stdout.strip() != f"sidecache {want}":
            fail(f"--version: {version.returncode} {version.stdout!r} {version.stderr!r}, want sidecache {want}")
        ok(f"the image's binary runs under chroot as 10001: {version.stdout.strip()}")
        help_text = subprocess.run([CHROOT, f"--userspec={USER}", root, "/usr/local/bin/sidecache", "--help"],
                                   capture_output=True, text=True, timeout=10, check=True).stdout
        with open(os.path.join(out, "help.txt"), "w") as f:
            f.write(help_text)
        ok(f"--help: {help_text.count('  --')} options")

        scenario_image(run, cfg, health, out)
        scenario_dns(run, cfg)
        scenario_tls(run, cfg, tls)
        if rendered:
            scenario_kubernetes(run, cfg, rendered)
        scenario_compose(run, cfg, health)
        scenario_systemd(run, cfg)
    finally:
        run.stop_all()


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "config":
        check_config(sys.argv[2])
    elif len(sys.argv) in (5, 6) and sys.argv[1] == "run":
        run_all(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] if len(sys.argv) == 6 else None)
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
