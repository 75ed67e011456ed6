#!/usr/bin/env python3
"""Checks of the deployment files' contents, for deploy/check.sh.

    files.py flags HELP.txt
        Every flag and SIDECACHE_* variable that a deployment file gives the
        binary is one its --help lists (HELP.txt: the image's binary's).
    files.py same-objects RENDERED.yaml STATIC.yaml
        The two hold the same Kubernetes objects (parsed, so comments and
        order do not count).
    files.py component KUBECTL COMPONENT_DIR WORK_DIR
        The kustomize component adds the sidecar to the workloads it is
        meant for, keeps what they had, and leaves the others alone.
    files.py grafana DASHBOARD.json METRICS.txt RULES_OUT.yaml
        Every metric the dashboard's queries name is in METRICS.txt (a
        /metrics scrape), with every label the queries select or group by;
        writes the queries as Prometheus recording rules so that
        `promtool check rules` parses them.
"""
import json
import os
import re
import subprocess
import sys

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def ok(msg):
    print(f"ok   {msg}", flush=True)
    if os.environ.get("DEPLOY_CHECK_TALLY"):
        with open(os.environ["DEPLOY_CHECK_TALLY"], "a") as f:
            f.write("\n")


def deploy(path):
    return os.path.join(REPO, "deploy", path)


# --- flags -----------------------------------------------------------------------

def dockerfile_cmd(path):
    for line in open(path):
        if line.startswith("CMD "):
            return json.loads(line[4:])
    fail(f"{path}: no CMD")


def k8s_container(path, name="sidecache"):
    for doc in yaml.safe_load_all(open(path)):
        if not doc or doc.get("kind") not in ("Deployment", "StatefulSet"):
            continue
        pod = doc["spec"]["template"]["spec"]
        for c in pod.get("initContainers", []) + pod.get("containers", []):
            if c["name"] == name:
                return c
    fail(f"{path}: no {name} container")


def check_flags(help_path):
    help_text = open(help_path).read()
    flags = set(re.findall(r"^\s+(?:-\w, )?--([a-z0-9-]+)", help_text, re.M))
    envs = set(re.findall(r"\[env: (SIDECACHE_[A-Z0-9_]+)[=\]]", help_text))
    if len(flags) < 20 or len(envs) < 20:
        fail(f"{help_path}: only {len(flags)} flags and {len(envs)} variables found")
    used = []  # (file, flag or variable)
    for f in ["Dockerfile", "Dockerfile.prebuilt"]:
        used += [(f, a) for a in dockerfile_cmd(deploy(f)) if a.startswith("--")]
    comp = yaml.safe_load(open(deploy("compose.yaml")))["services"]["sidecache"]
    used += [("compose.yaml", a) for a in comp.get("command", []) if a.startswith("--")]
    used += [("compose.yaml", k) for k in comp.get("environment", {})]
    for f in ["kubernetes/sidecar.yaml", "kubernetes/kustomize/sidecar/patch.yaml"]:
        c = k8s_container(deploy(f))
        used += [(f, a) for a in c.get("args", []) + c.get("command", []) if a.startswith("--")]
        used += [(f, e["name"]) for e in c.get("env", [])]
    unit = open(deploy("sidecache.service")).read()
    exec_start = re.search(r"^ExecStart=(.*)$", unit, re.M).group(1)
    used += [("sidecache.service", a) for a in exec_start.split() if a.startswith("--")]
    used += [("sidecache.service", v) for v in re.findall(r"\b(SIDECACHE_[A-Z0-9_]+)=", unit)]
    qs = open(deploy("quickstart.sh")).read()
    start = re.search(r'"\$SIDECACHE_BIN" \\\n((?:.*\\\n)+)', qs)
    if not start:
        fail("quickstart.sh: no sidecache command line found")
    used += [("quickstart.sh", a) for a in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", start.group(1))]
    toml = open(deploy("sidecache.toml.example")).read()
    used += [("sidecache.toml.example", "--" + k.replace("_", "-"))
             for k in re.findall(r"^#? ?([a-z][a-z0-9_]*) = ", toml, re.M)]
    used += [("sidecache.toml.example", v) for v in re.findall(r"\b(SIDECACHE_[A-Z0-9_]+)=", toml)]
    bad = []
    for f, name in used:
        name = name.split("=", 1)[0]
        known = flags if name.startswith("--") else envs
        if name.lstrip("-") not in known:
            bad.append(f"{f}: {name}")
    if bad:
        fail("not in the binary's --help:\n  " + "\n  ".join(bad))
    files = sorted({f for f, _ in used})
    ok(f"{len(used)} flags and variables used in {', '.join(files)}: all in --help")


# --- Kubernetes ---------------------------------------------------------------

def objects(path):
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def check_same_objects(rendered, static):
    a, b = objects(rendered), objects(static)
    if sorted(a) != sorted(b):
        fail(f"{rendered} holds {sorted(a)}, {static} holds {sorted(b)}")
    for k in a:
        if a[k] != b[k]:
            import difflib
            diff = difflib.unified_diff(
                json.dumps(b[k], indent=1, sort_keys=True).splitlines(),
                json.dumps(a[k], indent=1, sort_keys=True).splitlines(),
                static, rendered, lineterm="")
            fail(f"{k} differs:\n" + "\n".join(diff))
    ok(f"the kustomize example renders the same {len(a)} objects as {os.path.relpath(static, REPO)}")


FIXTURE = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: injected
  annotations: {sidecache/inject: "true"}
spec:
  selector: {matchLabels: {app: injected}}
  template:
    metadata: {labels: {app: injected}}
    spec:
      containers: [{name: web, image: web:1}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: stateful
  annotations: {sidecache/inject: "true"}
spec:
  serviceName: stateful
  selector: {matchLabels: {app: stateful}}
  template:
    metadata: {labels: {app: stateful}, annotations: {own: "kept"}}
    spec:
      securityContext: {runAsNonRoot: true}
      initContainers: [{name: migrate, image: migrate:1}]
      volumes: [{name: data, emptyDir: {}}]
      containers: [{name: db, image: db:1}]
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: untouched
spec:
  selector: {matchLabels: {app: untouched}}
  template:
    metadata: {labels: {app: untouched}}
    spec:
      containers: [{name: other, image: other:1}]
"""


def check_component(kubectl, component, work):
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, "workloads.yaml"), "w") as f:
        f.write(FIXTURE)
    with open(os.path.join(work, "kustomization.yaml"), "w") as f:
        yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": ["workloads.yaml"],
            "components": [os.path.relpath(component, work)],
            "images": [{"name": "sidecache", "newName": "registry.example/sidecache", "newTag": "9.9.9"}],
        }, f)
    out = subprocess.run([kubectl, "kustomize", work], capture_output=True, text=True)
    if out.returncode != 0:
        fail(f"kubectl kustomize {work}: {out.stderr}")
    docs = {d["metadata"]["name"]: d for d in yaml.safe_load_all(out.stdout) if d}
    for name, own_init, own_vol in [("injected", [], []), ("stateful", ["migrate"], ["data"])]:
        pod = docs[name]["spec"]["template"]["spec"]
        inits = [c["name"] for c in pod.get("initContainers", [])]
        vols = [v["name"] for v in pod.get("volumes", [])]
        sc = next((c for c in pod.get("initContainers", []) if c["name"] == "sidecache"), None)
        if sc is None or sc.get("restartPolicy") != "Always":
            fail(f"{name}: no native sidecar in {inits}")
        if sc["image"] != "registry.example/sidecache:9.9.9":
            fail(f"{name}: image {sc['image']}: the images: transformer did not apply")
        if sorted(inits) != sorted(own_init + ["sidecache"]) or sorted(vols) != sorted(own_vol + ["sidecache-run"]):
            fail(f"{name}: init containers {inits}, volumes {vols}")
        if pod["securityContext"].get("fsGroup") != 10001:
            fail(f"{name}: fsGroup {pod['securityContext']}")
    st = docs["stateful"]["spec"]["template"]
    if st["metadata"]["annotations"].get("own") != "kept" or not st["spec"]["securityContext"].get("runAsNonRoot"):
        fail(f"stateful: its own annotations or securityContext were lost: {st}")
    if "initContainers" in docs["untouched"]["spec"]["template"]["spec"]:
        fail("a workload without the annotation got the sidecar")
    ok("component: annotated Deployment and StatefulSet get the sidecar (own init containers, volumes, "
       "annotations kept; image rewritten by images:), the unannotated one does not")


# --- Grafana ---------------------------------------------------------------------

def scrape_labels(text):
    """{series name: {label: set(values)}} from a Prometheus text scrape."""
    series = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s", line)
        if not m:
            continue
        labels = series.setdefault(m.group(1), {})
        for k, v in re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(3) or ""):
            labels.setdefault(k, set()).add(v)
    return series


def queries(dash):
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                if t.get("expr"):
                    out.append((p.get("title", "?"), t["expr"]))
            walk(p.get("panels", []))
    walk(dash.get("panels", []))
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        if isinstance(q, str) and "sidecache_" in q:
            out.append((f"variable {v['name']}", q))
    return out


def group_after(expr, i):
    """The balanced (...) group starting at or after index i."""
    start = expr.index("(", i)
    depth = 0
    for j in range(start, len(expr)):
        depth += {"(": 1, ")": -1}.get(expr[j], 0)
        if depth == 0:
            return expr[start:j + 1]
    fail(f"unbalanced parentheses in {expr}")


TARGET_LABELS = {"instance", "job"}  # added by Prometheus when it scrapes


def check_grafana(dash_path, metrics_path, rules_out):
    dash = json.load(open(dash_path))
    series = scrape_labels(open(metrics_path).read())
    problems, names, rules = [], set(), []
    for n, (title, expr) in enumerate(queries(dash)):
        for m in re.finditer(r"\b(sidecache_[a-z0-9_]+)\b(\{[^}]*\})?", expr):
            name, sel = m.group(1), m.group(2) or ""
            names.add(name)
            if name not in series:
                problems.append(f"{title}: {name} is not in /metrics")
                continue
            for label, op, value in re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', sel):
                if label in TARGET_LABELS:
                    continue
                if label not in series[name]:
                    problems.append(f"{title}: {name} has no label {label}")
                elif op == "=" and value not in series[name][label]:
                    problems.append(f"{title}: {name}{{{label}=\"{value}\"}} not in /metrics "
                                    f"(values seen: {sorted(series[name][label])})")
        for m in re.finditer(r"\bby\s*\(([^)]*)\)", expr):
            labels = [l.strip() for l in m.group(1).split(",") if l.strip()]
            inner = group_after(expr, m.end())
            for name in re.findall(r"\b(sidecache_[a-z0-9_]+)\b", inner):
                for label in labels:
                    if label not in TARGET_LABELS and label not in series.get(name, {}):
                        problems.append(f"{title}: groups {name} by {label}, which it does not have")
        if not title.startswith("variable "):
            prom = (expr.replace("$__rate_interval", "5m").replace("$__interval", "1m")
                    .replace("$__range", "1h").replace("${instance}", ".*").replace("$instance", ".*"))
            rules.append({"record": f"dashboard:query_{n}", "expr": prom})
    if len(names) < 20:
        problems.append(f"only {len(names)} metrics found in the dashboard's queries")
    if problems:
        fail("dashboard:\n  " + "\n  ".join(problems))
    with open(rules_out, "w") as f:
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, f)
    ok(f"dashboard: {len(names)} metrics in {len(rules)} queries, all in a live /metrics scrape with the labels used")


def main():
    a = sys.argv[1:]
    if a[:1] == ["flags"] and len(a) == 2:
        check_flags(a[1])
    elif a[:1] == ["same-objects"] and len(a) == 3:
        check_same_objects(a[1], a[2])
    elif a[:1] == ["component"] and len(a) == 4:
        check_component(a[1], a[2], a[3])
    elif a[:1] == ["grafana"] and len(a) == 4:
        check_grafana(a[1], a[2], a[3])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
