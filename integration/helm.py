#!/usr/bin/env python3
"""The Helm chart's test: lint, render, validate offline, check the descriptor config.

For the chart's defaults and each file in helm/sluice/examples/ it runs `helm lint --strict`,
renders the chart with `helm template`, validates every manifest with `kubernetes-validate
--strict` against Kubernetes KUBE_VERSION's schemas, checks what the schemas cannot (the
security context, the directory mount that makes reloads work, the peer and Redis wiring, the
grace period), and feeds each rendered ConfigMap's descriptor files to `sluice check-config`.
Then it checks that bad values files are refused with a message naming the bad value.

Tools: helm (SLUICE_HELM, else target/helm/helm, else PATH), kubernetes-validate (beside this
Python, else PATH) and the sluice binary (SLUICE_BIN, else $CARGO_TARGET_DIR/debug/sluice,
else built with cargo). scripts/test.sh installs the first two into target/. A missing tool
skips the test, or fails it under CI=true. The last line is `helm: N passed, M failed`.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import yaml
except ImportError:  # reported by find_tools()
    yaml = None

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "sluice"
EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))
KUBE_VERSION = "1.33.0"
# Kinds that kubernetes-validate has no schema for (CRDs); checked by hand below.
CRD_KINDS = {"ServiceMonitor"}

passed = 0
failed = 0


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"ok   {name}")
    else:
        failed += 1
        print(f"FAIL {name}")
        if detail:
            print("     " + detail.strip().replace("\n", "\n     "))


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def find_tools():
    """Returns (helm, kubernetes-validate, sluice) paths, or exits saying what is missing."""
    missing = []
    if yaml is None:
        missing.append(f"PyYAML for {sys.executable} (it comes with kubernetes-validate in target/venv)")
    helm = os.environ.get("SLUICE_HELM") or (
        str(ROOT / "target/helm/helm") if (ROOT / "target/helm/helm").exists() else shutil.which("helm")
    )
    if not helm:
        missing.append("helm (bash scripts/test.sh installs it into target/helm, or set SLUICE_HELM)")
    kv = Path(sys.executable).parent / "kubernetes-validate"
    kv = str(kv) if kv.exists() else shutil.which("kubernetes-validate")
    if not kv:
        missing.append("kubernetes-validate (pip install kubernetes-validate; scripts/test.sh puts it in target/venv)")
    sluice = os.environ.get("SLUICE_BIN")
    if not sluice:
        target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
        if not (target / "debug/sluice").exists():
            run(["cargo", "build", "-q", "--locked", "--bin", "sluice"], cwd=ROOT)
        if (target / "debug/sluice").exists():
            sluice = str(target / "debug/sluice")
        else:
            missing.append(f"the sluice binary ({target}/debug/sluice; cargo build)")
    if missing:
        ci = os.environ.get("CI", "").lower() in ("true", "1")
        for m in missing:
            print(f"{'FAIL' if ci else 'SKIPPED'}: helm chart test needs {m}")
        print(f"helm: 0 passed, {1 if ci else 0} failed")
        sys.exit(1 if ci else 0)
    return helm, kv, sluice


def render(helm, values):
    args = [helm, "template", "sluice", str(CHART), "--namespace", "rl"]
    if values:
        args += ["-f", str(values)]
    return run(args)


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


def check_deployment(label, docs, values):
    """What the schemas cannot say: security, the config mount, peers, Redis, shutdown."""
    deploy = next(d for d in docs if d["kind"] == "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    sc, psc = c["securityContext"], pod["securityContext"]
    check(
        f"{label}: non-root, read-only root, no escalation, no capabilities, RuntimeDefault seccomp",
        psc.get("runAsNonRoot") is True
        and sc.get("runAsNonRoot") is True
        and sc.get("readOnlyRootFilesystem") is True
        and sc.get("allowPrivilegeEscalation") is False
        and sc.get("capabilities", {}).get("drop") == ["ALL"]
        and psc.get("seccompProfile", {}).get("type") == "RuntimeDefault"
        and pod.get("automountServiceAccountToken") is False,
        yaml.safe_dump({"pod": psc, "container": sc}),
    )
    env = env_of(c)
    mounts = [m for m in c["volumeMounts"] if m["name"] == "config"]
    vol = next(v for v in pod["volumes"] if v["name"] == "config")
    cm_names = {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
    check(
        f"{label}: config ConfigMap mounted as a directory (no subPath) at SLUICE_CONFIG",
        len(mounts) == 1
        and "subPath" not in mounts[0]
        and "subPathExpr" not in mounts[0]
        and env["SLUICE_CONFIG"]["value"] == mounts[0]["mountPath"]
        and (vol["configMap"]["name"] in cm_names or values.get("config", {}).get("existingConfigMap")),
        yaml.safe_dump({"mounts": mounts, "volume": vol}),
    )
    ready, live = c.get("readinessProbe", {}), c.get("livenessProbe", {})
    check(
        f"{label}: readiness on gRPC health `ratelimit` (8081), liveness on `\"\"`",
        ready.get("grpc") == {"port": 8081, "service": "ratelimit"}
        and live.get("grpc") == {"port": 8081, "service": ""},
        yaml.safe_dump({"readiness": ready, "liveness": live}),
    )
    delay = int(env["SLUICE_SHUTDOWN_DELAY_SECS"]["value"])
    drain = int(env["SLUICE_DRAIN_TIMEOUT_SECS"]["value"])
    period = ready.get("periodSeconds", 10) * ready.get("failureThreshold", 3)
    check(
        f"{label}: grace period {pod['terminationGracePeriodSeconds']}s > delay {delay}s + drain {drain}s;"
        f" delay >= readiness failing time {period}s",
        pod["terminationGracePeriodSeconds"] > delay + drain and delay >= period,
    )
    spread = pod.get("topologySpreadConstraints", [])
    check(
        f"{label}: topology spread over zones and nodes",
        {t["topologyKey"] for t in spread} >= {"topology.kubernetes.io/zone", "kubernetes.io/hostname"},
    )

    if values.get("cluster", {}).get("enabled"):
        peers = [d for d in docs if d["kind"] == "Service" and d["spec"].get("clusterIP") == "None"]
        ok = len(peers) == 1
        if ok:
            svc = peers[0]
            names = list(env)
            fqdn = f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc.cluster.local"
            ok = (
                svc["spec"].get("publishNotReadyAddresses") is True
                and [p["port"] for p in svc["spec"]["ports"]] == [8082]
                and env["PEERS_DNS"]["value"] == fqdn
                and env["PEER_PORT"]["value"] == "8082"
                and env["PEER_ADVERTISE_ADDRESS"]["value"] == "$(POD_IP):8082"
                and env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
                # $(VAR) only expands variables defined earlier in the list.
                and names.index("POD_IP") < names.index("PEER_ADVERTISE_ADDRESS")
                and "PEERS" not in env
            )
        check(
            f"{label}: headless peer Service (publishNotReadyAddresses, 8082) feeds PEERS_DNS, "
            "PEER_ADVERTISE_ADDRESS=$(POD_IP):8082",
            ok,
            yaml.safe_dump({"peer services": peers, "env": list(env.values())}),
        )
    if values.get("backend") == "redis":
        auth = env.get("REDIS_AUTH", {}).get("valueFrom", {}).get("secretKeyRef", {})
        want = values["redis"]["auth"].get("existingSecret")
        check(
            f"{label}: BACKEND_TYPE=redis, REDIS_URL, REDIS_AUTH from Secret {want}",
            env["BACKEND_TYPE"]["value"] == "redis"
            and env["REDIS_SOCKET_TYPE"]["value"] == "tcp"
            and env["REDIS_URL"]["value"] == values["redis"]["url"]
            and auth.get("name") == want
            and auth.get("key") == values["redis"]["auth"].get("existingSecretKey", "password")
            and "value" not in env["REDIS_AUTH"],
            yaml.safe_dump(env.get("REDIS_AUTH")),
        )
    if values.get("metrics", {}).get("serviceMonitor", {}).get("enabled"):
        sm = [d for d in docs if d["kind"] == "ServiceMonitor"]
        metrics_svcs = [
            d
            for d in docs
            if d["kind"] == "Service"
            and all(d["metadata"]["labels"].get(k) == v for k, v in sm[0]["spec"]["selector"]["matchLabels"].items())
        ] if sm else []
        check(
            f"{label}: ServiceMonitor scrapes /metrics on the debug port of exactly one Service",
            len(sm) == 1
            and sm[0]["apiVersion"] == "monitoring.coreos.com/v1"
            and sm[0]["spec"]["endpoints"][0]["path"] == "/metrics"
            and sm[0]["spec"]["endpoints"][0]["port"] == "debug"
            and len(metrics_svcs) == 1
            and [p["name"] for p in metrics_svcs[0]["spec"]["ports"]] == ["debug"],
            yaml.safe_dump(sm),
        )


def check_config(label, sluice, docs, values):
    """Writes each rendered ConfigMap's files to a directory and runs `sluice check-config`."""
    for cm in (d for d in docs if d["kind"] == "ConfigMap"):
        with tempfile.TemporaryDirectory() as tmp:
            for name, text in cm.get("data", {}).items():
                (Path(tmp) / name).write_text(text)
            args = [sluice, "check-config", tmp]
            if values.get("config", {}).get("mergeDomainConfig"):
                args.insert(2, "--merge-domain-config")
            r = run(args)
            check(
                f"{label}: sluice check-config accepts ConfigMap {cm['metadata']['name']} "
                f"({', '.join(sorted(cm.get('data', {})))})",
                r.returncode == 0,
                r.stdout + r.stderr,
            )


def main():
    helm, kv, sluice = find_tools()
    print(f"== helm chart: {run([helm, 'version', '--short']).stdout.strip()}, "
          f"kubernetes-validate against {KUBE_VERSION}")

    for values in [None, *EXAMPLES]:
        label = values.name if values else "defaults"
        values_doc = yaml.safe_load(values.read_text()) if values else {}
        lint = [helm, "lint", "--strict", str(CHART)] + (["-f", str(values)] if values else [])
        r = run(lint)
        check(f"{label}: helm lint --strict", r.returncode == 0, r.stdout + r.stderr)

        r = render(helm, values)
        check(f"{label}: helm template", r.returncode == 0, r.stderr)
        if r.returncode != 0:
            continue
        docs = [d for d in yaml.safe_load_all(r.stdout) if d]
        kinds = sorted(d["kind"] for d in docs)
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            f.write(r.stdout)
            f.flush()
            v = run([kv, "--strict", "--quiet", "-k", KUBE_VERSION, f.name])
        unknown = [
            line for line in (v.stdout + v.stderr).splitlines()
            if "Couldn't find schema" in line and not any(f"kind {k} " in line for k in CRD_KINDS)
        ]
        check(
            f"{label}: kubernetes-validate --strict, {len(docs)} manifests ({', '.join(kinds)})",
            v.returncode == 0 and not unknown,
            v.stdout + v.stderr,
        )
        check_deployment(label, docs, values_doc)
        check_config(label, sluice, docs, values_doc)

    # Bad values: each must be refused, and the message must name what is wrong.
    bad = [
        ("replicaCount: three", {"replicaCount": "three"}, ["replicaCount", "want integer"]),
        ("unknown key replicas", {"replicas": 3}, ["additional properties 'replicas' not allowed"]),
        ("misspelt nested key", {"cluster": {"enable": True}}, ["/cluster", "'enable' not allowed"]),
        ("backend: mongo", {"backend": "mongo"}, ["/backend", "memory", "redis"]),
        ("config file not .yaml", {"config": {"files": {"edge.txt": "domain: x\n"}}}, ["edge.txt"]),
        ("backend redis without url", {"backend": "redis"}, ["needs redis.url"]),
        ("env sets a chart-managed variable", {"env": {"PEERS_DNS": "x"}}, ["env.PEERS_DNS is set by the chart"]),
        ("grace period too short", {"shutdown": {"terminationGracePeriodSeconds": 10}}, ["must exceed"]),
        ("env value not a string", {"env": {"SHADOW_MODE": True}}, ["/env/SHADOW_MODE", "want string"]),
    ]
    for name, values, want in bad:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            yaml.safe_dump(values, f)
            f.flush()
            r = render(helm, Path(f.name))
        msg = r.stderr
        check(
            f"bad values refused: {name}",
            r.returncode != 0 and all(w in msg for w in want),
            f"exit {r.returncode}; wanted {want} in:\n{msg}",
        )

    # A broken descriptor config renders (Helm cannot know the format) but check-config refuses it.
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump({"config": {"files": {"bad.yaml": "domain: edge\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n"}}}, f)
        f.flush()
        r = render(helm, Path(f.name))
    docs = [d for d in yaml.safe_load_all(r.stdout) if d] if r.returncode == 0 else []
    cms = [d for d in docs if d["kind"] == "ConfigMap"]
    with tempfile.TemporaryDirectory() as tmp:
        for cm in cms:
            for name, text in cm["data"].items():
                (Path(tmp) / name).write_text(text)
        c = run([sluice, "check-config", tmp])
    check(
        "a bad descriptor in values is caught by sluice check-config",
        len(cms) == 1 and c.returncode == 1 and "bad.yaml" in c.stdout + c.stderr,
        c.stdout + c.stderr,
    )

    print(f"helm: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
