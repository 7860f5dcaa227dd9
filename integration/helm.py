#!/usr/bin/env python3
"""The Helm chart's test: lint, render, validate offline, check the descriptor config.

For the chart's defaults and each file in helm/sluice/examples/ it runs `helm lint --strict`,
renders the chart with `helm template`, validates every manifest with `kubernetes-validate
--strict` against Kubernetes KUBE_VERSION's schemas, checks what the schemas cannot (the
security context, the directory mount that makes reloads work, the peer and Redis wiring, the
grace period, the TLS Secret mounts, peer TLS and its cert-manager Certificate, the
NetworkPolicy, the tracing, write-behind and RLQS variables, and the runtime limits' token
Secret and claim), and feeds
each rendered ConfigMap's descriptor files to `sluice check-config`. The same is done for a few
value combinations (COMBOS). Then, for every render, it starts the real sluice binary with the
rendered container environment (ports moved to free ones, Secret values faked, every mounted
volume replaced by a temporary directory: the ConfigMap's files, and test certificates made
with openssl for each Secret) and checks that it gets past its settings validation and binds
its ports, and, with gRPC TLS, that the gRPC port completes a TLS handshake with a client
certificate; with peer TLS, that the peer port answers a peer holding the mounted certificate
and refuses a client without one, or with one lacking the peers' name; with the runtime-limits
token file, that the debug port refuses a PUT without the token (401) or with another (403) and
takes it, and with the claim, that the limit reaches the file and a restarted binary loads it. Then it checks that bad values files are refused with a message naming the bad
value, and that a mismatched certificate and key under the rendered paths stops the binary.

Tools: helm (SLUICE_HELM, else target/helm/helm, else PATH), kubernetes-validate (beside this
Python, else PATH), openssl (PATH) and the sluice binary (SLUICE_BIN, else $CARGO_TARGET_DIR/debug/sluice,
else built with cargo). scripts/test.sh installs the first two into target/. A missing tool
fails the test under the test command and CI, and skips it elsewhere (integration/tools.py). The last line is `helm: N passed, M failed`.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tools

tools.use_venv()

try:
    import yaml
except ImportError:  # reported by find_tools()
    yaml = None

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "sluice"
CHART_APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))
# Value combinations the examples leave out, checked like them.
COMBOS = {
    "redis sentinel over TLS with a client certificate, mTLS with a separate CA Secret": {
        "backend": "redis",
        "redis": {
            "type": "sentinel",
            "url": "mymaster,sentinel-0.redis:26379,sentinel-1.redis:26379",
            "auth": {"existingSecret": "redis-auth"},
            "sentinelAuth": {"existingSecret": "redis-auth", "existingSecretKey": "sentinel"},
            "tls": {"enabled": True, "secretName": "redis-client", "caKey": "redis-ca.pem",
                    "certKey": "tls.crt", "keyKey": "tls.key", "skipHostnameVerification": True},
        },
        "grpcTls": {"enabled": True, "secretName": "sluice-tls",
                    "clientCa": {"enabled": True, "secretName": "envoy-ca", "key": "root.pem"}},
        "probes": {"type": "grpc"},
    },
    "Redis cluster over TLS with the system's roots, TLS without client CA": {
        "backend": "redis",
        "redis": {"type": "cluster", "url": "redis-0.redis:6379,redis-1.redis:6379",
                  "tls": {"enabled": True, "caKey": ""}},
        "grpcTls": {"enabled": True, "secretName": "sluice-tls"},
    },
    "OTLP metrics alone, over OTLP/HTTP in plain text": {
        "otlpMetrics": {"enabled": True, "interval": 15000},
        "tracing": {"endpoint": "http://otel-collector.observability:4318"},
    },
    "tracing to an https collector with a private CA and a client certificate": {
        "tracing": {"enabled": True, "protocol": "grpc", "endpoint": "https://otel.observability:4317",
                    "tls": {"secretName": "otel-client", "certKey": "tls.crt"}},
    },
    "tracing with the defaults": {"tracing": {"enabled": True, "samplingRate": 0.25}},
    "peer TLS from cert-manager with a ClusterIssuer and an explicit name, divided mode": {
        "replicaCount": 2,
        "cluster": {"enabled": True, "mode": "divided", "clusterDomain": "k8s.example",
                    "tls": {"enabled": True, "san": "peers.sluice.example", "secretName": "peers-cert",
                            "certManager": {"enabled": True, "duration": "720h", "renewBefore": "240h",
                                            "issuerRef": {"name": "internal-ca", "kind": "ClusterIssuer"}}}},
    },
    "lease mode with a faster renewal below a parent, RLQS with shorter assignments and a key order": {
        "replicaCount": 3,
        "cluster": {"enabled": True, "mode": "lease", "lease": {
            "renewMs": 50, "durationMs": 500, "maxBytes": 16777216,
            "parent": {"peers": "10.8.0.4:8082,10.8.0.5:8082", "clusterName": "eu-west", "renewMs": 150,
                       "expectedClusters": 3},
            "childrenFrom": [{"ipBlock": {"cidr": "10.9.0.0/16"}}]}},
        "networkPolicy": {"enabled": True},
        "rlqs": {"assignmentTtlSecs": 5, "abandonIdleSecs": 10, "maxBytes": 8388608, "keyOrder": "tenant, plan"},
    },
    "Redis sentinel with both passwords read from mounted Secret files": {
        "backend": "redis",
        "redis": {
            "type": "sentinel",
            "url": "mymaster,sentinel-0.redis:26379",
            "auth": {"existingSecret": "redis-auth", "existingSecretKey": "pw", "fromFile": True},
            "sentinelAuth": {"existingSecret": "redis-sentinel", "fromFile": True},
        },
    },
    "extra volumes, mounts and objects; a Recreate strategy and a shorter history": {
        "extraVolumes": [{"name": "extra-ca", "secret": {"secretName": "corp-ca"}}],
        "extraVolumeMounts": [{"name": "extra-ca", "mountPath": "/etc/extra-ca", "readOnly": True}],
        "extraObjects": [
            {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": "{{ .Release.Name }}-extra"}, "data": {"k": "v"}},
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-extra-text\ndata:\n  k: v\n",
        ],
        "revisionHistoryLimit": 2,
        "updateStrategy": {"type": "Recreate"},
        "counterAdmin": {"resetEnabled": True},
        "networkPolicy": {"enabled": True},
    },
    "a mirror registry, a sidecar and an init container; helm test pods labelled": {
        "global": {"imageRegistry": "mirror.example.com"},
        "image": {"registry": "ignored.example.com", "tag": "1.2.3"},
        "sidecars": [{"name": "shipper", "image": "busybox", "args": ["{{ .Release.Name }}"]}],
        "initContainers": [{"name": "wait", "image": "busybox"}],
        "tests": {"podLabels": {"sluice-client": "true"}},
    },
    "no helm test pod": {"tests": {"enabled": False}},
    "the Grafana dashboard (in Grafana's namespace and folder) and the PrometheusRule": {
        "metrics": {
            "grafanaDashboard": {"enabled": True, "namespace": "grafana", "folder": "Sluice"},
            "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus"}},
        },
    },
    "memcached by address, with TLS from a Secret and a client certificate": {
        "backend": "memcache",
        "replicaCount": 2,
        "memcache": {"hostPort": "memcached-0.memcached:11211,memcached-1.memcached:11211", "maxIdleConns": 4,
                     "timeoutMs": 250, "maxPending": 512,
                     "tls": {"enabled": True, "secretName": "memcached-client", "certKey": "tls.crt",
                             "keyKey": "tls.key", "skipHostnameVerification": True}},
    },
    "memcached from SRV records, refreshed": {
        "backend": "memcache",
        "replicaCount": 3,
        "memcache": {"srv": "_memcache._tcp.memcached.cache.svc.cluster.local", "srvRefresh": "30s"},
    },
    # MEMCACHED_PORT: replaced by the port of a real memcached main() starts.
    "memcached on a real server: the helm test pod's command passes": {
        "backend": "memcache",
        "memcache": {"hostPort": "127.0.0.1:MEMCACHED_PORT"},
    },
    "runtime limits on one pod, kept on a new ReadWriteOncePod claim of a StorageClass": {
        "runtimeLimits": {"adminTokens": {"existingSecret": "sluice-admin"},
                          "persistence": {"enabled": True, "size": "2Gi", "storageClassName": "fast-ssd",
                                          "accessModes": ["ReadWriteOncePod"]}},
        "updateStrategy": {"type": "Recreate"},
    },
    "runtime limits on one pod, kept on an existing claim": {
        "runtimeLimits": {"adminTokens": {"existingSecret": "sluice-admin"},
                          "persistence": {"enabled": True, "existingClaim": "sluice-limits"}},
        "updateStrategy": {"type": "Recreate"},
    },
    "runtime limits in Redis on three pods: the token Secret mounted as a directory": {
        "backend": "redis",
        "replicaCount": 3,
        "redis": {"url": "redis.redis:6379"},
        "runtimeLimits": {"adminTokens": {"existingSecret": "sluice-admin", "existingSecretKey": "bearer"}},
        "networkPolicy": {"enabled": True, "metricsFrom": [{"podSelector": {"matchLabels": {"app": "limits-admin"}}}]},
    },
    "peer write-behind to a single Redis with a created password Secret": {
        "cluster": {"enabled": True, "writeBehind": {"enabled": True, "intervalMs": 100}},
        "redis": {"url": "redis.redis:6379", "auth": {"password": "s3cret"}},
    },
}
KUBE_VERSION = "1.33.0"
# Where the chart mounts the runtime-limits API's token Secret, and the token pod_env puts there.
ADMIN_TOKENS_DIR = "/etc/sluice/admin-tokens"
ADMIN_TOKEN = "helm-test-token-0123456789abcdef"
# Where the chart mounts the runtime limits' claim, and the file in it.
RUNTIME_LIMITS_DIR = "/var/lib/sluice"
RUNTIME_LIMITS_PATH = f"{RUNTIME_LIMITS_DIR}/runtime-limits.json"
# Kinds that kubernetes-validate has no schema for (CRDs); checked by hand below.
CRD_KINDS = {"ServiceMonitor", "Certificate", "PrometheusRule"}

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
    if not shutil.which("openssl"):
        missing.append("openssl (for the test certificates)")
    if not shutil.which("memcached"):
        missing.append("memcached (apt-get install memcached; scripts/test.sh installs it)")
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
        failed = tools.missing("the helm chart test", missing)
        print(f"helm: 0 passed, {int(failed)} failed")
        sys.exit(int(failed))
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
    c = pod["containers"][0]
    check_extras(label, docs, deploy, values)
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
    grpc_tls = values.get("grpcTls", {}).get("enabled")
    if grpc_tls or values.get("probes", {}).get("type") == "http":
        check(
            f"{label}: readiness on HTTP /healthcheck, liveness on the HTTP port"
            + (" (gRPC TLS: the kubelet's gRPC probes cannot speak it)" if grpc_tls else ""),
            ready.get("httpGet") == {"path": "/healthcheck", "port": "http"}
            and live.get("tcpSocket") == {"port": "http"}
            and "grpc" not in ready and "grpc" not in live,
            yaml.safe_dump({"readiness": ready, "liveness": live}),
        )
    else:
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
    check_memory_budget(label, c, env)
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
            domain = values["cluster"].get("clusterDomain", "cluster.local")
            fqdn = f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc.{domain}"
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
        lease = values["cluster"].get("lease", {})
        want = {
            "SLUICE_LEASE_RENEW_MS": str(lease.get("renewMs", 100)),
            "SLUICE_LEASE_DURATION_MS": str(lease.get("durationMs", 1000)),
            "SLUICE_LEASE_MAX_BYTES": str(lease.get("maxBytes", 33554432)),
        }
        parent = lease.get("parent", {})
        if parent.get("peers"):
            want |= {
                "SLUICE_LEASE_PARENT": parent["peers"],
                "SLUICE_LEASE_CLUSTER_NAME": parent["clusterName"],
                "SLUICE_LEASE_PARENT_RENEW_MS": str(parent.get("renewMs", 200)),
                "SLUICE_LEASE_PARENT_TIMEOUT_MS": str(parent.get("timeoutMs", 1000)),
                "SLUICE_LEASE_PARENT_EXPECTED_CLUSTERS": str(parent.get("expectedClusters", 2)),
            }
        got = {k: v["value"] for k, v in env.items() if k.startswith("SLUICE_LEASE_")}
        in_lease = values["cluster"].get("mode") == "lease"
        check(
            f"{label}: SLUICE_LEASE_* (and a parent's) set from cluster.lease in lease mode only",
            got == (want if in_lease else {}),
            f"want {want if in_lease else {}}, got {got}",
        )
    rlqs = values.get("rlqs", {})
    want = {
        "SLUICE_RLQS_ASSIGNMENT_TTL_SECS": str(rlqs.get("assignmentTtlSecs", 10)),
        "SLUICE_RLQS_ABANDON_IDLE_SECS": str(rlqs.get("abandonIdleSecs", 300)),
        "SLUICE_RLQS_MAX_BYTES": str(rlqs.get("maxBytes", 33554432)),
        "SLUICE_RLQS_KEY_ORDER": rlqs.get("keyOrder", ""),
    }
    got = {k: e.get("value") for k, e in env.items() if k.startswith("SLUICE_RLQS_")}
    check(f"{label}: SLUICE_RLQS_* set from rlqs (the quota service is always on)", got == want,
          f"want {want}, got {got}")
    write_behind = values.get("cluster", {}).get("writeBehind", {}).get("enabled")
    if values.get("backend") == "redis" or write_behind:
        auth = env.get("REDIS_AUTH", {}).get("valueFrom", {}).get("secretKeyRef", {})
        auth_values = values["redis"].get("auth", {})
        created = [d for d in docs if d["kind"] == "Secret"]
        if auth_values.get("existingSecret"):
            want = {"name": auth_values["existingSecret"], "key": auth_values.get("existingSecretKey", "password")}
        elif auth_values.get("password"):
            # The chart's own Secret, holding the value under `password`.
            want = {"name": created[0]["metadata"]["name"] if created else "?", "key": "password"}
        else:
            want = {}
        backend = "memory" if write_behind else "redis"
        from_file = auth_values.get("fromFile")
        check(
            f"{label}: BACKEND_TYPE={backend}, REDIS_URL, REDIS_AUTH from Secret {want.get('name', '(none)')}"
            + (" as a mounted file (REDIS_AUTH_FILE)" if from_file else ""),
            env["BACKEND_TYPE"]["value"] == backend
            and env["REDIS_SOCKET_TYPE"]["value"] == "tcp"
            and env["REDIS_URL"]["value"] == values["redis"]["url"]
            and (from_file or auth == want)
            and "value" not in env.get("REDIS_AUTH", {}),
            yaml.safe_dump({"REDIS_AUTH": env.get("REDIS_AUTH"), "want": want}),
        )
        vols = {v["name"]: v for v in pod.get("volumes", [])}
        mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
        sentinel_values = values["redis"].get("sentinelAuth", {})
        for var, vol, source in [
            ("REDIS_AUTH", "redis-auth", {**want, "fromFile": from_file}),
            ("REDIS_SENTINEL_AUTH", "redis-sentinel-auth",
             {"name": sentinel_values.get("existingSecret"), "key": sentinel_values.get("existingSecretKey", "password"),
              "fromFile": sentinel_values.get("fromFile")}),
        ]:
            if not (source.get("fromFile") and source.get("name")):
                check(f"{label}: {var} is not read from a file", f"{var}_FILE" not in env and vol not in vols,
                      yaml.safe_dump({k: v for k, v in env.items() if k.startswith(var)}))
                continue
            path = f"/etc/sluice/{vol}/{source['key']}"
            check(
                f"{label}: {var}_FILE={path}, Secret {source['name']} mounted as a directory, no {var}",
                env.get(f"{var}_FILE", {}).get("value") == path
                and var not in env
                and vols.get(vol, {}).get("secret", {}).get("secretName") == source["name"]
                and mounts.get(vol, {}).get("mountPath") == f"/etc/sluice/{vol}"
                and "subPath" not in mounts.get(vol, {}),
                yaml.safe_dump({"env": {k: v for k, v in env.items() if k.startswith(var)},
                                "volume": vols.get(vol), "mount": mounts.get(vol)}),
            )
    check_features(label, pod, c, env, values)
    check_runtime_limits(label, docs, pod, c, env, values)
    check_peer_objects(label, docs, values)
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


# What one more connection or request in flight costs at worst, measured by
# bench/listener_memory.py (docs/hardening.md): an idle HTTP/2 connection, a gRPC call waiting
# for its message; and the process itself, before any client.
CONNECTION_BYTES = 16_518
INFLIGHT_BYTES = 9_821
PROCESS_BYTES = 16 * 1024 * 1024


def check_extras(label, docs, deploy, values):
    """revisionHistoryLimit, updateStrategy, extra volumes, mounts and objects, the image and its
    registry, sidecars and init containers, the helm test pod, the counter reset switch."""
    spec = deploy["spec"]
    pod = spec["template"]["spec"]
    c = pod["containers"][0]
    want_strategy = values.get("updateStrategy",
                               {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}})
    check(
        f"{label}: revisionHistoryLimit {values.get('revisionHistoryLimit', 5)}, strategy {want_strategy['type']}",
        spec.get("revisionHistoryLimit") == values.get("revisionHistoryLimit", 5)
        and spec.get("strategy") == want_strategy,
        yaml.safe_dump({"revisionHistoryLimit": spec.get("revisionHistoryLimit"), "strategy": spec.get("strategy")}),
    )
    vols = [v["name"] for v in pod.get("volumes", [])]
    mounts = [m["name"] for m in c.get("volumeMounts", [])]
    extra_vols = [v["name"] for v in values.get("extraVolumes", [])]
    extra_mounts = [m["name"] for m in values.get("extraVolumeMounts", [])]
    check(
        f"{label}: extra volumes {extra_vols} and mounts {extra_mounts} after the chart's own",
        vols[len(vols) - len(extra_vols):] == extra_vols and mounts[len(mounts) - len(extra_mounts):] == extra_mounts,
        yaml.safe_dump({"volumes": vols, "mounts": mounts}),
    )
    registry = values.get("global", {}).get("imageRegistry") or values.get("image", {}).get("registry")
    want_image = f"{registry + '/' if registry else ''}sluice:{values.get('image', {}).get('tag') or CHART_APP_VERSION}"
    check(f"{label}: image {want_image}", c["image"] == want_image, c["image"])
    names = [x["name"] for x in pod["containers"]]
    want = ["sluice"] + [x["name"] for x in values.get("sidecars", [])]
    check(f"{label}: containers {want}, sidecars after sluice, templates expanded", names == want
          and all(x.get("args") != ["{{ .Release.Name }}"] for x in pod["containers"]), str(pod["containers"][1:]))
    inits = [x["name"] for x in pod.get("initContainers", [])]
    check(f"{label}: init containers {inits}", inits == [x["name"] for x in values.get("initContainers", [])])
    tests = [d for d in docs if d.get("metadata", {}).get("annotations", {}).get("helm.sh/hook") == "test"]
    if values.get("tests", {}).get("enabled", True):
        ok = len(tests) == 1 and tests[0]["kind"] == "Pod"
        probe = tests[0]["spec"]["containers"][0] if ok else {}
        check(f"{label}: one helm test pod running `sluice probe` on the release's HTTP Service, same image",
              ok and probe["image"] == c["image"]
              and probe["args"] == ["probe", "--address", "sluice.rl.svc:8080"]
              and tests[0]["spec"]["restartPolicy"] == "Never"
              and all(tests[0]["metadata"]["labels"].get(k) == v
                      for k, v in values.get("tests", {}).get("podLabels", {}).items()),
              yaml.safe_dump(tests))
    else:
        check(f"{label}: no helm test pod", not tests, yaml.safe_dump(tests))
    metrics = values.get("metrics", {})
    dashboards = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]
    if metrics.get("grafanaDashboard", {}).get("enabled"):
        want = json.loads((CHART / "files" / "dashboard.json").read_text())
        ok = len(dashboards) == 1
        d = dashboards[0] if ok else {}
        check(f"{label}: the dashboard ConfigMap holds files/dashboard.json, labelled for the sidecar",
              ok and json.loads(d["data"]["sluice.json"]) == want
              and d["metadata"]["labels"].get("grafana_dashboard") == "1"
              and d["metadata"]["namespace"] == metrics["grafanaDashboard"].get("namespace", "rl")
              and d["metadata"].get("annotations", {}).get("grafana_folder") == metrics["grafanaDashboard"].get("folder"),
              yaml.safe_dump(dashboards)[:2000])
    else:
        check(f"{label}: no dashboard ConfigMap", not dashboards)
    rules = [d for d in docs if d["kind"] == "PrometheusRule"]
    if metrics.get("prometheusRule", {}).get("enabled"):
        want = yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
        check(f"{label}: the PrometheusRule holds files/alerts.yaml's groups, with its labels",
              len(rules) == 1 and rules[0]["spec"] == want
              and all(rules[0]["metadata"]["labels"].get(k) == v
                      for k, v in metrics["prometheusRule"].get("labels", {}).items()),
              yaml.safe_dump(rules)[:2000])
    else:
        check(f"{label}: no PrometheusRule", not rules)
    reset = values.get("counterAdmin", {}).get("resetEnabled", False)
    check(
        f"{label}: SLUICE_DEBUG_COUNTER_RESET is {str(reset).lower()}",
        env_of(c).get("SLUICE_DEBUG_COUNTER_RESET", {}).get("value") == str(reset).lower(),
        str(env_of(c).get("SLUICE_DEBUG_COUNTER_RESET")),
    )
    extra = values.get("extraObjects", [])
    if extra:
        names = {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
        check(f"{label}: each extra object rendered, templates expanded ({len(extra)})",
              {"sluice-extra", "sluice-extra-text"} <= names, str(sorted(names)))


def quantity(q):
    """A Kubernetes memory quantity in bytes ("384Mi", "1G", "268435456")."""
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "K": 10**3, "M": 10**6, "G": 10**9}
    for suffix, factor in units.items():
        if str(q).endswith(suffix):
            return int(float(str(q)[: -len(suffix)]) * factor)
    return int(q)


def check_memory_budget(label, c, env):
    """The worst the listener limits and the counter budget allow fits the memory limit, so a
    flood gets refusals, not an OOM-killed pod."""
    limit = c.get("resources", {}).get("limits", {}).get("memory")
    if limit is None:
        return
    listeners = 3 + ("PEER_PORT" in env) + (env.get("USE_PROMETHEUS", {}).get("value") == "true")
    per_listener = (int(env["SLUICE_MAX_CONNECTIONS"]["value"]) * CONNECTION_BYTES
                    + int(env["SLUICE_MAX_INFLIGHT_REQUESTS"]["value"]) * INFLIGHT_BYTES)
    # Lease mode's two tables (held leases, granted leases), and below a parent a third (its
    # grants), each bounded by SLUICE_LEASE_MAX_BYTES.
    tables = 3 if "SLUICE_LEASE_PARENT" in env else 2
    leases = tables * int(env.get("SLUICE_LEASE_MAX_BYTES", {}).get("value", 0))
    # The quota service is always on: its buckets and holders, bounded by SLUICE_RLQS_MAX_BYTES
    # (Sluice's own default when unset).
    rlqs = int(env.get("SLUICE_RLQS_MAX_BYTES", {}).get("value", 32 << 20))
    worst = (int(env["SLUICE_MAX_COUNTER_BYTES"]["value"]) + listeners * per_listener
             + int(env["SLUICE_MAX_PENDING_REQUEST_BYTES"]["value"]) + PROCESS_BYTES + leases + rlqs)
    check(f"{label}: the worst case the limits allow ({worst / 2**20:.0f}Mi over {listeners} listeners) "
          f"fits the memory limit ({limit})", worst <= quantity(limit))


def secret_ref(env, name):
    return env.get(name, {}).get("valueFrom", {}).get("secretKeyRef", {})


def check_features(label, pod, c, env, values):
    """Secret mounts (directories, read-only) and the gRPC TLS, Redis TLS and sentinel, tracing,
    OTLP metrics and write-behind variables, as values.yaml documents them."""
    vols = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    secret_vols = [n for n, v in vols.items() if "secret" in v]
    check(
        f"{label}: Secret volumes {secret_vols or '(none)'} mounted read-only as directories (no subPath)",
        all(n in mounts and mounts[n].get("readOnly") is True and "subPath" not in mounts[n]
            and "subPathExpr" not in mounts[n] for n in secret_vols)
        and set(mounts) == set(vols),
        yaml.safe_dump({"mounts": c["volumeMounts"], "volumes": pod["volumes"]}),
    )
    # Every file a variable names must lie in a mounted volume.
    dirs = [m["mountPath"] for m in c["volumeMounts"]]
    files = {k: e["value"] for k, e in env.items() if k.endswith(("_CERT", "_KEY", "_CACERT", "_CERTIFICATE")) and "value" in e}
    check(
        f"{label}: the TLS files named by {sorted(files) or '(none)'} lie in mounted volumes",
        all(any(v.startswith(d + "/") for d in dirs) for v in files.values()),
        yaml.safe_dump({"files": files, "mounts": dirs}),
    )

    tls = values.get("grpcTls", {})
    if tls.get("enabled"):
        ca = tls.get("clientCa", {})
        ca_secret = ca.get("secretName") or tls["secretName"]
        want = {
            "GRPC_SERVER_USE_TLS": "true",
            "GRPC_SERVER_TLS_CERT": "/etc/sluice/grpc-tls/tls.crt",
            "GRPC_SERVER_TLS_KEY": "/etc/sluice/grpc-tls/tls.key",
        }
        if ca.get("enabled"):
            d = "/etc/sluice/grpc-tls" if ca_secret == tls["secretName"] else "/etc/sluice/grpc-client-ca"
            want["GRPC_CLIENT_TLS_CACERT"] = f"{d}/{ca.get('key', 'ca.crt')}"
            if ca_secret != tls["secretName"]:
                ok_ca = vols.get("grpc-client-ca", {}).get("secret", {}).get("secretName") == ca_secret
            else:
                ok_ca = "grpc-client-ca" not in vols
        else:
            ok_ca = "GRPC_CLIENT_TLS_CACERT" not in env
        if tls.get("clientSan"):
            want["GRPC_CLIENT_TLS_SAN"] = tls["clientSan"]
        got = {k: env.get(k, {}).get("value") for k in want}
        check(
            f"{label}: gRPC TLS from Secret {tls['secretName']} at /etc/sluice/grpc-tls"
            + (f", client CA from {ca_secret}" if ca.get("enabled") else ""),
            got == want
            and vols.get("grpc-tls", {}).get("secret", {}).get("secretName") == tls["secretName"]
            and mounts.get("grpc-tls", {}).get("mountPath") == "/etc/sluice/grpc-tls"
            and ok_ca,
            yaml.safe_dump({"env": got, "want": want, "volumes": pod["volumes"]}),
        )
    else:
        check(f"{label}: no gRPC TLS variables", not any(k.startswith("GRPC_SERVER_") or k.startswith("GRPC_CLIENT_") for k in env))

    redis = values.get("redis", {})
    uses_redis = values.get("backend") == "redis" or values.get("cluster", {}).get("writeBehind", {}).get("enabled")
    rtls = redis.get("tls", {})
    if uses_redis and rtls.get("enabled"):
        want = {"REDIS_TLS": "true", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": str(bool(rtls.get("skipHostnameVerification"))).lower()}
        if rtls.get("secretName"):
            ca_key = rtls.get("caKey", "ca.crt")
            if ca_key:
                want["REDIS_TLS_CACERT"] = f"/etc/sluice/redis-tls/{ca_key}"
            if rtls.get("certKey"):
                want["REDIS_TLS_CLIENT_CERT"] = f"/etc/sluice/redis-tls/{rtls['certKey']}"
                want["REDIS_TLS_CLIENT_KEY"] = f"/etc/sluice/redis-tls/{rtls['keyKey']}"
        got = {k: e.get("value") for k, e in env.items() if k.startswith("REDIS_TLS")}
        check(
            f"{label}: Redis TLS {sorted(want)} from Secret {rtls.get('secretName') or '(none: system roots)'}",
            got == want
            and (vols.get("redis-tls", {}).get("secret", {}).get("secretName") == rtls["secretName"]
                 if rtls.get("secretName") else "redis-tls" not in vols),
            yaml.safe_dump({"env": got, "want": want}),
        )
    else:
        check(f"{label}: no Redis TLS variables", not any(k.startswith("REDIS_TLS") for k in env))
    check_memcache(label, env, vols, values)
    if uses_redis and redis.get("type") == "sentinel":
        ref = secret_ref(env, "REDIS_SENTINEL_AUTH")
        sa = redis.get("sentinelAuth", {})
        check(
            f"{label}: REDIS_TYPE=sentinel, REDIS_SENTINEL_AUTH from Secret {sa.get('existingSecret')}"
            + (" (as a file, checked above)" if sa.get("fromFile") else ""),
            env["REDIS_TYPE"]["value"] == "sentinel"
            and (ref == {"name": sa["existingSecret"], "key": sa.get("existingSecretKey", "password")}
                 if sa.get("existingSecret") and not sa.get("fromFile") else "REDIS_SENTINEL_AUTH" not in env),
            yaml.safe_dump(env.get("REDIS_SENTINEL_AUTH")),
        )

    tr, om = values.get("tracing", {}), values.get("otlpMetrics", {})
    want = {}
    if tr.get("enabled"):
        want |= {"TRACING_ENABLED": "true", "TRACING_SAMPLING_RATE": str(tr.get("samplingRate", 1))}
        if tr.get("serviceName"):
            want["TRACING_SERVICE_NAME"] = tr["serviceName"]
    if om.get("enabled"):
        want |= {"OTEL_METRICS_EXPORTER": "otlp", "OTEL_METRIC_EXPORT_INTERVAL": str(om.get("interval", 60000))}
    if tr.get("enabled") or om.get("enabled"):
        want["TRACING_EXPORTER_PROTOCOL"] = tr.get("protocol", "http")
        if tr.get("endpoint"):
            want["OTEL_EXPORTER_OTLP_ENDPOINT"] = tr["endpoint"]
        otls = tr.get("tls", {})
        if otls.get("secretName"):
            if otls.get("caKey", "ca.crt"):
                want["OTEL_EXPORTER_OTLP_CERTIFICATE"] = f"/etc/sluice/otlp-tls/{otls.get('caKey', 'ca.crt')}"
            if otls.get("certKey"):
                want["OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"] = f"/etc/sluice/otlp-tls/{otls['certKey']}"
                want["OTEL_EXPORTER_OTLP_CLIENT_KEY"] = f"/etc/sluice/otlp-tls/{otls.get('keyKey', 'tls.key')}"
    got = {k: e.get("value") for k, e in env.items()
           if (k.startswith("TRACING_") or k.startswith("OTEL_")) and k != "OTEL_EXPORTER_OTLP_HEADERS"}
    hdr = tr.get("headers", {})
    want_hdr = ({"name": hdr["existingSecret"], "key": hdr.get("existingSecretKey", "headers")}
                if hdr.get("existingSecret") and (tr.get("enabled") or om.get("enabled")) else {})
    check(
        f"{label}: tracing / OTLP variables {sorted(want) or '(none)'}"
        + (f", headers from Secret {want_hdr['name']}" if want_hdr else ""),
        got == want and secret_ref(env, "OTEL_EXPORTER_OTLP_HEADERS") == want_hdr,
        yaml.safe_dump({"env": got, "want": want}),
    )

    check_peer_tls(label, pod, c, env, values)

    wb = values.get("cluster", {}).get("writeBehind", {})
    want = ({"SLUICE_PEER_WRITE_BEHIND": "true", "SLUICE_PEER_WRITE_BEHIND_MS": str(wb.get("intervalMs", 500))}
            if wb.get("enabled") else {})
    got = {k: e.get("value") for k, e in env.items() if k.startswith("SLUICE_PEER_WRITE_BEHIND")}
    check(f"{label}: write-behind variables {sorted(want) or '(none)'}", got == want, yaml.safe_dump(got))


def check_memcache(label, env, vols, values):
    """backend: memcache sets MEMCACHE_* (hostPort or srv, TLS from its Secret); no other
    backend sets any."""
    if values.get("backend") != "memcache":
        check(f"{label}: no memcache variables", not any("MEMCACHE_" in k for k in env))
        return
    m = values["memcache"]
    want = {"MEMCACHE_MAX_IDLE_CONNS": str(m.get("maxIdleConns", 2)),
            "SLUICE_MEMCACHE_TIMEOUT_MS": str(m.get("timeoutMs", 500)),
            "SLUICE_MEMCACHE_MAX_PENDING": str(m.get("maxPending", 1024))}
    if m.get("hostPort"):
        want["MEMCACHE_HOST_PORT"] = m["hostPort"]
    else:
        want |= {"MEMCACHE_SRV": m["srv"], "MEMCACHE_SRV_REFRESH": m.get("srvRefresh", "0")}
    t = m.get("tls", {})
    if t.get("enabled"):
        want |= {"MEMCACHE_TLS": "true",
                 "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION": str(bool(t.get("skipHostnameVerification"))).lower()}
        if t.get("secretName") and t.get("caKey", "ca.crt"):
            want["MEMCACHE_TLS_CACERT"] = f"/etc/sluice/memcache-tls/{t.get('caKey', 'ca.crt')}"
        if t.get("secretName") and t.get("certKey"):
            want["MEMCACHE_TLS_CLIENT_CERT"] = f"/etc/sluice/memcache-tls/{t['certKey']}"
            want["MEMCACHE_TLS_CLIENT_KEY"] = f"/etc/sluice/memcache-tls/{t['keyKey']}"
    got = {k: e.get("value") for k, e in env.items() if "MEMCACHE_" in k}
    secret = t.get("secretName") if t.get("enabled") else None
    check(
        f"{label}: BACKEND_TYPE=memcache, {sorted(want)}"
        + (f", TLS files from Secret {secret}" if secret else ""),
        env["BACKEND_TYPE"]["value"] == "memcache"
        and got == want
        and "REDIS_URL" not in env
        and (vols.get("memcache-tls", {}).get("secret", {}).get("secretName") == secret
             if secret else "memcache-tls" not in vols),
        yaml.safe_dump({"env": got, "want": want}),
    )


def check_runtime_limits(label, docs, pod, c, env, values):
    """The runtime-limits API's token Secret: mounted read-only as a directory (a subPath mount
    never sees a rotated Secret) and named by SLUICE_ADMIN_TOKEN_FILE; neither without one. Then
    the runtime limits' file: on a claim mounted writable as a directory, in a Deployment of one
    pod replaced by Recreate."""
    runtime = values.get("runtimeLimits", {})
    tokens = runtime.get("adminTokens", {})
    vols = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    got = {"env": env.get("SLUICE_ADMIN_TOKEN_FILE"), "volume": vols.get("admin-tokens"),
           "mount": mounts.get("admin-tokens")}
    if tokens.get("existingSecret"):
        path = f"{ADMIN_TOKENS_DIR}/{tokens.get('existingSecretKey', 'tokens')}"
        want = {"env": {"name": "SLUICE_ADMIN_TOKEN_FILE", "value": path},
                "volume": {"name": "admin-tokens", "secret": {"secretName": tokens["existingSecret"]}},
                "mount": {"name": "admin-tokens", "mountPath": ADMIN_TOKENS_DIR, "readOnly": True}}
        check(f"{label}: SLUICE_ADMIN_TOKEN_FILE={path}, Secret {tokens['existingSecret']} mounted read-only as a "
              "directory (no subPath)", got == want, yaml.safe_dump({"got": got, "want": want}))
    else:
        check(f"{label}: no admin token file or volume (the runtime-limits API is off)",
              got == {"env": None, "volume": None, "mount": None}, yaml.safe_dump(got))

    persistence = runtime.get("persistence", {})
    claims = [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    got = {"env": env.get("SLUICE_RUNTIME_LIMITS_PATH"), "volume": vols.get("runtime-limits"),
           "mount": mounts.get("runtime-limits")}
    if not persistence.get("enabled"):
        check(f"{label}: no runtime limits' file, volume or claim",
              got == {"env": None, "volume": None, "mount": None} and not claims,
              yaml.safe_dump({"got": got, "claims": claims}))
        return
    claim = persistence.get("existingClaim") or "sluice-runtime-limits"
    want = {"env": {"name": "SLUICE_RUNTIME_LIMITS_PATH", "value": RUNTIME_LIMITS_PATH},
            "volume": {"name": "runtime-limits", "persistentVolumeClaim": {"claimName": claim}},
            # Writable, and no subPath: the file is replaced by a rename in its directory.
            "mount": {"name": "runtime-limits", "mountPath": RUNTIME_LIMITS_DIR}}
    check(f"{label}: SLUICE_RUNTIME_LIMITS_PATH={RUNTIME_LIMITS_PATH} on claim {claim}, mounted writable as a "
          "directory", got == want, yaml.safe_dump({"got": got, "want": want}))
    if persistence.get("existingClaim"):
        check(f"{label}: no claim created beside the existing claim {claim}", not claims, yaml.safe_dump(claims))
    else:
        spec = {"accessModes": persistence.get("accessModes", ["ReadWriteOnce"]),
                "resources": {"requests": {"storage": persistence.get("size", "1Gi")}}}
        if persistence.get("storageClassName"):
            spec["storageClassName"] = persistence["storageClassName"]
        check(f"{label}: one claim {claim} in the release's namespace: {json.dumps(spec)}",
              [(d["metadata"]["name"], d["metadata"]["namespace"], d["spec"]) for d in claims] == [(claim, "rl", spec)],
              yaml.safe_dump({"claims": claims, "want spec": spec}))
    deploy = next(d for d in docs if d["kind"] == "Deployment")
    check(f"{label}: one pod writes the runtime limits' file: one replica, no HPA, replaced by Recreate",
          deploy["spec"].get("replicas") == 1 and deploy["spec"]["strategy"] == {"type": "Recreate"}
          and not any(d["kind"] == "HorizontalPodAutoscaler" for d in docs),
          yaml.safe_dump({"replicas": deploy["spec"].get("replicas"), "strategy": deploy["spec"]["strategy"]}))


def peer_tls_san(values):
    """SLUICE_PEER_TLS_SAN as the chart derives it (release sluice, namespace rl)."""
    cluster = values.get("cluster", {})
    return cluster.get("tls", {}).get("san") or f"sluice-peers.rl.svc.{cluster.get('clusterDomain', 'cluster.local')}"


def check_peer_tls(label, pod, c, env, values):
    """SLUICE_PEER_TLS from the mounted Secret, the cert-manager Certificate that writes it, and
    the peer Service's appProtocol (a mesh must pass the peers' TLS through)."""
    cluster = values.get("cluster", {})
    tls = cluster.get("tls", {})
    got = {k: e.get("value") for k, e in env.items() if k.startswith("SLUICE_PEER_TLS")}
    if not (cluster.get("enabled") and tls.get("enabled")):
        check(f"{label}: no peer TLS variables or volume", not got and "peer-tls" not in {v["name"] for v in pod["volumes"]},
              yaml.safe_dump(got))
        return
    secret = tls.get("secretName") or "sluice-peer-tls"
    want = {
        "SLUICE_PEER_TLS": "true",
        "SLUICE_PEER_TLS_CERT": "/etc/sluice/peer-tls/tls.crt",
        "SLUICE_PEER_TLS_KEY": "/etc/sluice/peer-tls/tls.key",
        "SLUICE_PEER_TLS_CACERT": "/etc/sluice/peer-tls/ca.crt",
        "SLUICE_PEER_TLS_SAN": peer_tls_san(values),
    }
    vols = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    check(
        f"{label}: peer TLS from Secret {secret} at /etc/sluice/peer-tls, SAN {want['SLUICE_PEER_TLS_SAN']}",
        got == want
        and vols.get("peer-tls", {}).get("secret", {}).get("secretName") == secret
        and mounts.get("peer-tls", {}).get("mountPath") == "/etc/sluice/peer-tls",
        yaml.safe_dump({"env": got, "want": want, "volumes": pod["volumes"]}),
    )


def check_peer_objects(label, docs, values):
    """The cert-manager Certificate (when asked for), the peer Service's appProtocol, and the
    NetworkPolicy: the peer port admits only the release's own pods, the client ports stay as
    clientsFrom says."""
    cluster = values.get("cluster", {})
    tls = cluster.get("tls", {})
    peer_tls = bool(cluster.get("enabled") and tls.get("enabled"))
    certs = [d for d in docs if d["kind"] == "Certificate"]
    cm = tls.get("certManager", {})
    if peer_tls and cm.get("enabled"):
        want_issuer = {"name": cm["issuerRef"]["name"], "kind": cm["issuerRef"].get("kind", "Issuer"),
                       "group": cm["issuerRef"].get("group", "cert-manager.io")}
        spec = certs[0]["spec"] if len(certs) == 1 else {}
        check(
            f"{label}: cert-manager Certificate for {peer_tls_san(values)} (server and client auth) writes the mounted Secret",
            len(certs) == 1
            and certs[0]["apiVersion"] == "cert-manager.io/v1"
            and spec.get("dnsNames") == [peer_tls_san(values)]
            and spec.get("secretName") == (tls.get("secretName") or "sluice-peer-tls")
            and {"server auth", "client auth"} <= set(spec.get("usages", []))
            and spec.get("issuerRef") == want_issuer
            and spec.get("duration", "") == cm.get("duration", "")
            and spec.get("renewBefore", "") == cm.get("renewBefore", ""),
            yaml.safe_dump(certs),
        )
    else:
        check(f"{label}: no Certificate", not certs, yaml.safe_dump(certs))
    if cluster.get("enabled"):
        (svc,) = [d for d in docs if d["kind"] == "Service" and d["spec"].get("clusterIP") == "None"]
        proto = svc["spec"]["ports"][0].get("appProtocol")
        check(f"{label}: peer Service appProtocol {proto}", proto == ("https" if peer_tls else "kubernetes.io/h2c"))

    nps = [d for d in docs if d["kind"] == "NetworkPolicy"]
    npv = values.get("networkPolicy", {})
    if not npv.get("enabled"):
        check(f"{label}: no NetworkPolicy", not nps)
        return
    deploy = next(d for d in docs if d["kind"] == "Deployment")
    selector = {"podSelector": {"matchLabels": deploy["spec"]["selector"]["matchLabels"]}}
    (np,) = nps
    rules = np["spec"]["ingress"]
    ports = lambda r: {p["port"] for p in r.get("ports", [])}
    peer_rules = [r for r in rules if "peer" in ports(r)]
    client_rules = [r for r in rules if ports(r) & {"grpc", "http"}]
    ok = (
        np["spec"]["podSelector"] == selector["podSelector"]
        and np["spec"]["policyTypes"] == ["Ingress"]
        # A rule without ports would open every port, the peer port included.
        and all(r.get("ports") for r in rules)
        and len(client_rules) == 1
        and ports(client_rules[0]) == {"grpc", "http"}
        and client_rules[0].get("from", []) == npv.get("clientsFrom", [])
    )
    children = cluster.get("lease", {}).get("childrenFrom", [])
    if cluster.get("enabled"):
        ok = (ok and len(peer_rules) == 1 and ports(peer_rules[0]) == {"peer"}
              and peer_rules[0].get("from") == [selector] + children)
    else:
        ok = ok and not peer_rules
    check(
        f"{label}: NetworkPolicy admits the peer port only from the release's pods"
        + (" and cluster.lease.childrenFrom" if children else "")
        + (" (no peer port)" if not cluster.get("enabled") else "")
        + ", gRPC and HTTP from clientsFrom",
        ok,
        yaml.safe_dump(np),
    )


def make_certs(tmp):
    """A CA, a server certificate for localhost/127.0.0.1 and a client certificate for
    envoy.ingress.svc.cluster.local, all signed by the CA; plus a key that matches nothing."""
    d = Path(tmp)
    ossl = lambda *a: subprocess.run(["openssl", *a], cwd=d, check=True, capture_output=True)
    ossl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "ca.key",
         "-out", "ca.crt", "-days", "2", "-subj", "/CN=test-ca")
    # The server certificate doubles as the pods' peer certificate: it carries the peer names
    # the renders use (peer_tls_san).
    server_san = ("DNS:localhost,IP:127.0.0.1,DNS:sluice-peers.rl.svc.cluster.local,"
                  "DNS:sluice-peers.rl.svc.k8s.example,DNS:peers.sluice.example")
    for name, san in [("server", server_san), ("client", "DNS:envoy.ingress.svc.cluster.local")]:
        ossl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", f"/CN={name}", "-addext", f"subjectAltName={san}")
        (d / f"{name}.ext").write_text(f"subjectAltName={san}\n")
        ossl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext")
    ossl("genpkey", "-algorithm", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "other.key")
    return {n: (d / n).read_text() for n in ["ca.crt", "server.crt", "server.key", "client.crt", "client.key", "other.key"]}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pod_env(docs, certs, tmp, key_pem=None):
    """The rendered container's environment as the kubelet would give it, made runnable here:
    mounted volumes become directories under tmp (ConfigMap files; each Secret gets the test
    certificates under tls.crt, tls.key, ca.crt and every file name a variable asks of it),
    Secret-sourced values are faked, ports move to free ones, POD_IP is 127.0.0.1."""
    deploy = next(d for d in docs if d["kind"] == "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    c = pod["containers"][0]
    vols = {v["name"]: v for v in pod["volumes"]}
    cms = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    moved = {}
    for m in c["volumeMounts"]:
        local = Path(tmp) / m["name"]
        local.mkdir()
        moved[m["mountPath"]] = str(local)
        v = vols[m["name"]]
        if "configMap" in v:
            for name, text in cms[v["configMap"]["name"]]["data"].items():
                (local / name).write_text(text)
        elif "secret" in v:
            wanted = {"tls.crt", "tls.key", "ca.crt"}
            tokens = set()
            for e in c["env"]:
                if e.get("value", "").startswith(m["mountPath"] + "/"):
                    wanted.add(e["value"][len(m["mountPath"]) + 1:])
                    if e["name"] == "SLUICE_ADMIN_TOKEN_FILE":
                        tokens.add(e["value"][len(m["mountPath"]) + 1:])
            for name in wanted:
                if name in tokens:
                    text = f"helm-test {ADMIN_TOKEN}\n"
                elif "ca" in name.split(".")[0]:
                    text = certs["ca.crt"]
                elif name.endswith(".key") or "key" in name:
                    text = key_pem or certs["server.key"]
                else:
                    text = certs["server.crt"]
                (local / name).write_text(text)
    ports = {k: free_port() for k in ["PORT", "GRPC_PORT", "DEBUG_PORT", "PEER_PORT"]}
    env = {"PATH": os.environ.get("PATH", "")}
    for e in c["env"]:
        name = e["name"]
        if "valueFrom" in e:
            src = e["valueFrom"]
            if "fieldRef" in src:
                value = {"status.podIP": "127.0.0.1"}[src["fieldRef"]["fieldPath"]]
            else:
                value = "x-api-key=test" if name.endswith("_HEADERS") else "test-secret"
        else:
            # $(VAR) expands variables defined earlier in the list, as the kubelet does.
            value = re.sub(r"\$\((\w+)\)", lambda mt: env.get(mt.group(1), mt.group(0)), e.get("value", ""))
        for path, local in moved.items():
            if value == path or value.startswith(path + "/"):
                value = local + value[len(path):]
        if name in ports:
            value = str(ports[name])
        env[name] = value
    if "PEER_ADVERTISE_ADDRESS" in env:
        env["PEER_ADVERTISE_ADDRESS"] = f"127.0.0.1:{ports['PEER_PORT']}"
    return env, ports


def wait_healthy(port, wait=10.0):
    """Polls /healthcheck on `port` until it answers 200, at most `wait` seconds."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as c:
                c.sendall(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if c.recv(64).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            pass
        time.sleep(0.05)


def start_memcached():
    """A memcached on a free 127.0.0.1 port, answering (within 10 s): (process, port)."""
    port = free_port()
    proc = subprocess.Popen(["memcached", "-l", "127.0.0.1", "-p", str(port), "-U", "0", "-u", "root", "-m", "16"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as c:
                c.sendall(b"version\r\n")
                if c.recv(64).startswith(b"VERSION"):
                    return proc, port
        except OSError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            sys.exit("memcached did not start")
        time.sleep(0.05)


def start(sluice, env, port, wait=10.0):
    """Starts sluice; returns (None, proc) once `port` accepts, or (exit code, output) if it exits."""
    proc = subprocess.Popen([sluice], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return proc.returncode, proc.stdout.read()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return None, proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    proc.wait()
    return "timeout", proc.stdout.read()


def stop(proc):
    proc.kill()
    proc.wait()
    proc.stdout.close()


def tls_handshake(port, certs, tmp):
    """A TLS handshake with the gRPC port (ALPN h2), trusting the test CA, with the client
    certificate; returns the negotiated ALPN protocol or the error."""
    import ssl
    ctx = ssl.create_default_context(cafile=str(Path(tmp) / "ca.crt"))
    ctx.load_cert_chain(str(Path(tmp) / "client.crt"), str(Path(tmp) / "client.key"))
    ctx.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            with ctx.wrap_socket(raw, server_hostname="localhost") as s:
                return s.selected_alpn_protocol()
    except (OSError, ssl.SSLError) as e:
        return f"error: {e}"


def peer_call(port, tmp, san, identity):
    """Connects to the peer port as a peer does: TLS trusting the CA, verifying `san`, presenting
    `identity` (server or client, from make_certs; None for no certificate), then the HTTP/2
    preface and an empty SETTINGS frame. Returns "settings" when the server answers with its
    own SETTINGS frame (it took the certificate); else what happened. With TLS 1.3 a refused
    client certificate shows as an alert after the handshake, on the first read."""
    import ssl
    ctx = ssl.create_default_context(cafile=str(Path(tmp) / "ca.crt"))
    if identity:
        ctx.load_cert_chain(str(Path(tmp) / f"{identity}.crt"), str(Path(tmp) / f"{identity}.key"))
    ctx.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            with ctx.wrap_socket(raw, server_hostname=san) as s:
                s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
                frame = s.recv(9)
                return "settings" if len(frame) >= 4 and frame[3] == 4 else f"unexpected {frame!r}"
    except (OSError, ssl.SSLError) as e:
        return f"error: {e}"


# A runtime limit for the chart's example domain, and its PUT body (a `rate_limit`'s fields).
RUNTIME_LIMIT = ("/limits/edge/remote_address=10.0.0.1", '{"unit": "second", "requests_per_unit": 5}')


def admin_call(port, method, path, token=None, body=None, wait=5.0):
    """One call to the runtime-limits API on the debug port: (status, body), or (None, the
    error) when nothing answers within `wait` seconds."""
    import urllib.error
    import urllib.request
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                 data=body.encode() if body is not None else None)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    deadline = time.monotonic() + wait
    while True:
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except OSError as e:
            if time.monotonic() > deadline:
                return None, str(e)
            time.sleep(0.05)


def check_runtime_api(label, env, ports):
    """With SLUICE_ADMIN_TOKEN_FILE: the running binary refuses a PUT without a token (401) or
    with another (403) and takes the one in the mounted file (201 with in-memory counters); with
    SLUICE_RUNTIME_LIMITS_PATH too, the limit reaches that file in the claim's directory.
    Returns whether it did."""
    if "SLUICE_ADMIN_TOKEN_FILE" not in env:
        return False
    path, body = RUNTIME_LIMIT
    calls = {who: admin_call(ports["DEBUG_PORT"], "PUT", path, token, body)
             for who, token in [("no token", None), ("another token", "not-" + ADMIN_TOKEN),
                                ("the mounted token", ADMIN_TOKEN)]}
    status = {who: code for who, (code, _) in calls.items()}
    memory = env.get("BACKEND_TYPE") == "memory"
    ok = (status["no token"] == 401 and status["another token"] == 403
          # Elsewhere the limit goes to a backend this test does not run: the token is enough.
          and (status["the mounted token"] == 201 if memory else status["the mounted token"] not in (None, 401, 403)))
    check(f"{label}: the runtime-limits API refuses a PUT without a token (401) or with another (403), "
          "and takes the mounted token" + (" (201)" if memory else ""), ok, yaml.safe_dump(calls))
    file = Path(env["SLUICE_RUNTIME_LIMITS_PATH"]) if "SLUICE_RUNTIME_LIMITS_PATH" in env else None
    if not (ok and memory and file):
        return False
    # A change is appended to the file's journal beside it (the file is rewritten now and then).
    journal = file.with_name(file.name + ".journal")
    saved = lambda: any(p.exists() and "10.0.0.1" in p.read_text() for p in (file, journal))
    deadline = time.monotonic() + 5
    while not saved() and time.monotonic() < deadline:
        time.sleep(0.05)
    written = saved()
    check(f"{label}: the limit is written to SLUICE_RUNTIME_LIMITS_PATH or its journal, in the claim's directory",
          written, "\n".join(p.read_text() if p.exists() else f"{p}: missing" for p in (file, journal))
          + f"\nin the directory: {sorted(os.listdir(file.parent))}")
    return written


def check_runtime_reload(label, sluice, env, ports):
    """A second sluice on the same claim directory (new ports) loads the limit the first one
    wrote: GET answers it."""
    env = dict(env)
    moved = {k: free_port() for k in ports if k in env}
    env.update({k: str(p) for k, p in moved.items()})
    code, proc = start(sluice, env, moved["PORT"])
    status, text = (None, f"exit {code}: {proc}") if code is not None else (None, "")
    if code is None:
        try:
            status, text = admin_call(moved["DEBUG_PORT"], "GET", RUNTIME_LIMIT[0], ADMIN_TOKEN)
        finally:
            stop(proc)
    check(f"{label}: a restarted sluice loads the limit from SLUICE_RUNTIME_LIMITS_PATH (GET 200)",
          status == 200 and json.loads(text) == json.loads(RUNTIME_LIMIT[1]), f"{status} {text}")


def check_settings(label, sluice, docs, values, certs, cert_dir):
    """Starts the real binary with the rendered environment: it must accept the settings and
    every file they name, and bind its ports; with gRPC TLS, the gRPC port must speak it."""
    with tempfile.TemporaryDirectory() as tmp:
        env, ports = pod_env(docs, certs, tmp)
        if env.get("MEMCACHE_SRV"):
            # The SRV name has no records here: start-up must stop, saying so, as Go's does.
            proc = subprocess.run([sluice], env=env, capture_output=True, text=True, timeout=60)
            check(f"{label}: sluice reads MEMCACHE_SRV and stops when it has no records",
                  proc.returncode != 0
                  and f"MEMCACHE_SRV={env['MEMCACHE_SRV']}: unable to fetch servers from SRV" in proc.stderr + proc.stdout,
                  proc.stdout + proc.stderr)
            return
        code, out = start(sluice, env, ports["PORT"])
        if code is not None:
            check(f"{label}: sluice starts with the rendered environment", False,
                  f"exit {code}\n{out}\n" + yaml.safe_dump(env))
            return
        kept = False
        try:
            check(f"{label}: sluice starts with the rendered environment (settings, files, ports)", True)
            if "127.0.0.1:" in env.get("MEMCACHE_HOST_PORT", ""):
                # A real memcached: healthy once it has answered (a moment after the ports).
                wait_healthy(ports["PORT"])
            if env.get("PEERS_DNS") or env.get("PEERS"):
                # A peer with no peer answering reports ready 5 s after it starts, once it has
                # waited for a peer's runtime limits (docs/runtime-limits.md#readiness); `helm
                # test` runs once the release's pods are ready.
                wait_healthy(ports["PORT"], wait=15.0)
            for t in (d for d in docs if d.get("metadata", {}).get("annotations", {}).get("helm.sh/hook") == "test"):
                args = [a if not a.endswith(".svc:8080") else f"127.0.0.1:{ports['PORT']}"
                        for a in t["spec"]["containers"][0]["args"]]
                r = run([sluice, *args])
                if env.get("BACKEND_TYPE") == "redis" or (
                        env.get("BACKEND_TYPE") == "memcache" and "127.0.0.1:" not in env.get("MEMCACHE_HOST_PORT", "")):
                    # No Redis (or memcached) here: the release is unhealthy, and the test must say so.
                    check(f"{label}: the helm test pod's command fails against a release whose backend is down",
                          r.returncode == 1 and "/healthcheck answered 500" in r.stderr, r.stdout + r.stderr)
                else:
                    check(f"{label}: the helm test pod's command passes against the release ({' '.join(args)})",
                          r.returncode == 0 and "overallCode OK" in r.stdout, r.stdout + r.stderr)
            kept = check_runtime_api(label, env, ports)
            if values.get("grpcTls", {}).get("enabled"):
                alpn = tls_handshake(ports["GRPC_PORT"], certs, cert_dir)
                check(f"{label}: the gRPC port completes a TLS handshake (ALPN h2) with the mounted certificate",
                      alpn == "h2", str(alpn))
            cluster = values.get("cluster", {})
            if cluster.get("enabled") and cluster.get("tls", {}).get("enabled"):
                san = peer_tls_san(values)
                calls = {who: peer_call(ports["PEER_PORT"], cert_dir, san, identity)
                         for who, identity in [("peer", "server"), ("no certificate", None),
                                               ("the CA's certificate without the peers' name", "client")]}
                check(f"{label}: the peer port answers a peer with the mounted certificate over mTLS ({san}) and "
                      "refuses a client without a certificate or without the peers' name",
                      calls["peer"] == "settings" and all(r != "settings" for w, r in calls.items() if w != "peer"),
                      yaml.safe_dump(calls))
        finally:
            stop(out)
        if kept:
            check_runtime_reload(label, sluice, env, ports)


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


def check_chart_files():
    """README.md is what scripts/chart_readme.py makes of values.yaml; Chart.yaml's metadata
    agrees with Cargo.toml (version, license) and names the image."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import chart_readme
    check("helm/sluice/README.md is current (run scripts/chart_readme.py after editing values.yaml)",
          (CHART / "README.md").read_text() == chart_readme.render())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    cargo = (ROOT / "Cargo.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', cargo, re.M).group(1)
    license_ = re.search(r'^license = "([^"]+)"', cargo, re.M).group(1)
    notes = chart.get("annotations", {})
    images = yaml.safe_load(notes.get("artifacthub.io/images", "[]"))
    check(f"Chart.yaml: appVersion {version} as Cargo.toml, license {license_}, maintainers, "
          "the image named, prerelease while 0.x",
          chart["appVersion"] == version
          and notes.get("artifacthub.io/license") == license_
          and chart.get("maintainers")
          and images == [{"name": "sluice", "image": f"sluice:{version}"}]
          and notes.get("artifacthub.io/prerelease") == str(version.startswith("0.")).lower(),
          yaml.safe_dump(chart))


def main():
    helm, kv, sluice = find_tools()
    print(f"== helm chart: {run([helm, 'version', '--short']).stdout.strip()}, "
          f"kubernetes-validate against {KUBE_VERSION}")
    check_chart_files()

    cert_tmp = tempfile.TemporaryDirectory()
    certs = make_certs(cert_tmp.name)
    combo_dir = tempfile.TemporaryDirectory()
    memcached, memcached_port = start_memcached()
    cases = [("defaults", None), *((v.name, v) for v in EXAMPLES)]
    for i, (name, doc) in enumerate(COMBOS.items()):
        path = Path(combo_dir.name) / f"combo{i}.yaml"
        path.write_text(yaml.safe_dump(doc).replace("MEMCACHED_PORT", str(memcached_port)))
        cases.append((name, path))

    for label, values in cases:
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
        check_settings(label, sluice, docs, values_doc, certs, cert_tmp.name)
        if label == "tls-tracing.yaml":
            tls_docs = docs

    # Bad values: each must be refused, and the message must name what is wrong.
    bad = [
        ("replicaCount: three", {"replicaCount": "three"}, ["replicaCount", "want integer"]),
        ("unknown key replicas", {"replicas": 3}, ["additional properties 'replicas' not allowed"]),
        ("misspelt nested key", {"cluster": {"enable": True}}, ["/cluster", "'enable' not allowed"]),
        ("backend: mongo", {"backend": "mongo"}, ["/backend", "memory", "redis", "memcache"]),
        ("config file not .yaml", {"config": {"files": {"edge.txt": "domain: x\n"}}}, ["edge.txt"]),
        ("backend redis without url", {"backend": "redis"}, ["needs redis.url"]),
        ("backend memcache without servers", {"backend": "memcache"},
         ["backend: memcache needs exactly one of memcache.hostPort", "memcache.srv"]),
        ("backend memcache with hostPort and srv", {"backend": "memcache", "memcache": {
            "hostPort": "m:11211", "srv": "_memcache._tcp.m"}}, ["needs exactly one of memcache.hostPort"]),
        ("backend memcache with the peer cluster", {"backend": "memcache", "memcache": {"hostPort": "m:11211"},
                                                    "cluster": {"enabled": True}},
         ["cluster.enabled and backend: memcache are alternatives"]),
        ("memcache.tls client cert without its key", {"backend": "memcache", "memcache": {"hostPort": "m:11211", "tls": {
            "enabled": True, "secretName": "t", "certKey": "tls.crt"}}}, ["memcache.tls: set certKey and keyKey together"]),
        ("memcache.tls CA without a Secret", {"backend": "memcache", "memcache": {"hostPort": "m:11211",
                                                                                 "tls": {"enabled": True}}},
         ["memcache.tls.secretName is needed"]),
        ("memcache.srvRefresh not a duration", {"memcache": {"srvRefresh": "soon"}},
         ["/memcache/srvRefresh", "does not match pattern"]),
        ("memcache.maxIdleConns above 64", {"memcache": {"maxIdleConns": 100}}, ["/memcache/maxIdleConns", "maximum"]),
        ("env sets a memcache variable", {"env": {"MEMCACHE_HOST_PORT": "m:11211"}},
         ["env.MEMCACHE_HOST_PORT is set by the chart"]),
        ("write-behind with backend: memcache", {"backend": "memcache", "memcache": {"hostPort": "m:11211"},
                                                 "cluster": {"enabled": True, "writeBehind": {"enabled": True}},
                                                 "redis": {"url": "r:6379"}}, ["needs backend: memory"]),
        ("env sets a chart-managed variable", {"env": {"PEERS_DNS": "x"}}, ["env.PEERS_DNS is set by the chart"]),
        ("grace period too short", {"shutdown": {"terminationGracePeriodSeconds": 10}}, ["must exceed"]),
        ("env value not a string", {"env": {"SHADOW_MODE": True}}, ["/env/SHADOW_MODE", "want string"]),
        ("env sets a TLS variable", {"env": {"GRPC_SERVER_USE_TLS": "true"}}, ["env.GRPC_SERVER_USE_TLS is set by the chart"]),
        ("grpcTls without a Secret", {"grpcTls": {"enabled": True}}, ["grpcTls.enabled needs grpcTls.secretName"]),
        ("grpcTls.clientSan without clientCa", {"grpcTls": {"enabled": True, "secretName": "t", "clientSan": "envoy"}},
         ["grpcTls.clientSan needs grpcTls.clientCa.enabled"]),
        ("grpcTls.clientCa without TLS", {"grpcTls": {"clientCa": {"enabled": True}}}, ["need grpcTls.enabled"]),
        ("grpcTls misspelt key", {"grpcTls": {"secret": "t"}}, ["/grpcTls", "'secret' not allowed"]),
        ("redis.type: memcached", {"redis": {"type": "memcached"}}, ["/redis/type", "sentinel"]),
        ("sentinel without a master name", {"backend": "redis", "redis": {"type": "sentinel", "url": "s-0:26379"}},
         ["redis.type: sentinel needs redis.url as <master name>"]),
        ("sentinelAuth without sentinel", {"backend": "redis", "redis": {"url": "r:6379", "sentinelAuth": {"existingSecret": "x"}}},
         ["redis.sentinelAuth", "needs redis.type: sentinel"]),
        ("redis.tls client cert without its key", {"backend": "redis", "redis": {"url": "r:6379", "tls": {
            "enabled": True, "secretName": "t", "certKey": "tls.crt"}}}, ["set certKey and keyKey together"]),
        ("redis.tls CA without a Secret", {"backend": "redis", "redis": {"url": "r:6379", "tls": {"enabled": True}}},
         ["redis.tls.secretName is needed"]),
        ("tracing TLS files for a plain-text collector",
         {"tracing": {"enabled": True, "endpoint": "http://otel:4318", "tls": {"secretName": "otel-ca"}}},
         ["tracing.tls.secretName", "https://"]),
        ("a collector endpoint without a scheme", {"tracing": {"enabled": True, "endpoint": "otel:4318"}},
         ["/tracing/endpoint", "does not match pattern"]),
        ("tracing protocol http/json", {"tracing": {"protocol": "http/json"}}, ["/tracing/protocol"]),
        ("sampling rate above 1", {"tracing": {"samplingRate": 2}}, ["/tracing/samplingRate"]),
        ("otlpMetrics interval not a number", {"otlpMetrics": {"interval": "1m"}}, ["/otlpMetrics/interval", "want integer"]),
        ("write-behind without the peer cluster", {"cluster": {"writeBehind": {"enabled": True}}, "redis": {"url": "r:6379"}},
         ["cluster.writeBehind.enabled needs cluster.enabled"]),
        ("write-behind in divided mode", {"cluster": {"enabled": True, "mode": "divided", "writeBehind": {"enabled": True}},
                                          "redis": {"url": "r:6379"}}, ["needs cluster.mode: forward"]),
        ("write-behind in lease mode", {"cluster": {"enabled": True, "mode": "lease", "writeBehind": {"enabled": True}},
                                        "redis": {"url": "r:6379"}}, ["needs cluster.mode: forward"]),
        ("a lease shorter than two renewals", {"cluster": {"enabled": True, "mode": "lease",
                                                           "lease": {"renewMs": 100, "durationMs": 150}}},
         ["cluster.lease.durationMs must be at least twice"]),
        ("lease renewal every 5 ms", {"cluster": {"lease": {"renewMs": 5}}}, ["/cluster/lease/renewMs", "minimum"]),
        ("a lease parent in forward mode", {"cluster": {"enabled": True, "lease": {"parent": {
            "peers": "r:8082", "clusterName": "a"}}}}, ["cluster.lease.parent.peers needs cluster.enabled and cluster.mode: lease"]),
        ("a lease parent without a cluster name", {"cluster": {"enabled": True, "mode": "lease", "lease": {"parent": {
            "peers": "r:8082"}}}}, ["needs cluster.lease.parent.clusterName"]),
        ("a lease parent renewing faster than the nodes", {"cluster": {"enabled": True, "mode": "lease", "lease": {
            "parent": {"peers": "r:8082", "clusterName": "a", "renewMs": 50}}}},
         ["cluster.lease.parent.renewMs must be at least cluster.lease.renewMs"]),
        ("a lease parent that is no host:port", {"cluster": {"lease": {"parent": {"peers": "r"}}}},
         ["/cluster/lease/parent/peers", "does not match pattern"]),
        ("a lease parent expecting no child cluster", {"cluster": {"lease": {"parent": {"expectedClusters": 0}}}},
         ["/cluster/lease/parent/expectedClusters", "minimum"]),
        ("write-behind with backend: redis", {"backend": "redis", "cluster": {"enabled": True, "writeBehind": {"enabled": True}},
                                              "redis": {"url": "r:6379"}}, ["needs backend: memory"]),
        ("write-behind without redis.url", {"cluster": {"enabled": True, "writeBehind": {"enabled": True}}},
         ["cluster.writeBehind.enabled needs redis.url"]),
        ("write-behind with REDIS_PERSECOND", {"cluster": {"enabled": True, "writeBehind": {"enabled": True}},
                                               "redis": {"url": "r:6379"}, "env": {"REDIS_PERSECOND": "true"}},
         ["remove env.REDIS_PERSECOND"]),
        ("write-behind interval 5 ms", {"cluster": {"writeBehind": {"intervalMs": 5}}},
         ["/cluster/writeBehind/intervalMs", "minimum"]),
        ("peer TLS without the peer cluster", {"cluster": {"tls": {"enabled": True, "secretName": "t"}}},
         ["cluster.tls.enabled needs cluster.enabled"]),
        ("peer TLS without a Secret or cert-manager", {"cluster": {"enabled": True, "tls": {"enabled": True}}},
         ["cluster.tls.enabled needs cluster.tls.secretName", "certManager.enabled"]),
        ("peer TLS from cert-manager without an issuer", {"cluster": {"enabled": True, "tls": {
            "enabled": True, "certManager": {"enabled": True}}}}, ["needs cluster.tls.certManager.issuerRef.name"]),
        ("peer TLS name without peer TLS", {"cluster": {"enabled": True, "tls": {"san": "peers.example"}}},
         ["cluster.tls.san and cluster.tls.certManager need cluster.tls.enabled"]),
        ("peer TLS name that is no name", {"cluster": {"tls": {"san": "two words"}}}, ["/cluster/tls/san", "does not match pattern"]),
        ("peer TLS issuer of an unknown kind", {"cluster": {"tls": {"certManager": {"issuerRef": {"kind": "Vault"}}}}},
         ["/cluster/tls/certManager/issuerRef/kind"]),
        ("env sets a peer TLS variable", {"env": {"SLUICE_PEER_TLS": "false"}}, ["env.SLUICE_PEER_TLS is set by the chart"]),
        ("maxCounterBytes below one counter of the longest key", {"maxCounterBytes": 4096},
         ["/maxCounterBytes", "minimum"]),
        ("listeners.maxConnections: 0", {"listeners": {"maxConnections": 0}},
         ["/listeners/maxConnections", "minimum"]),
        ("listeners misspelt key", {"listeners": {"maxConnection": 10}},
         ["/listeners", "'maxConnection' not allowed"]),
        ("env sets a listener limit", {"env": {"SLUICE_MAX_CONNECTIONS": "10"}},
         ["env.SLUICE_MAX_CONNECTIONS is set by the chart"]),
        ("RLQS buckets abandoned before two assignments expire",
         {"rlqs": {"assignmentTtlSecs": 200, "abandonIdleSecs": 300}},
         ["rlqs.abandonIdleSecs (300) must be at least twice rlqs.assignmentTtlSecs (200)"]),
        ("RLQS assignments living 0 s", {"rlqs": {"assignmentTtlSecs": 0}}, ["/rlqs/assignmentTtlSecs", "minimum"]),
        ("RLQS assignments living over an hour", {"rlqs": {"assignmentTtlSecs": 3601, "abandonIdleSecs": 7202}},
         ["/rlqs/assignmentTtlSecs", "maximum"]),
        ("RLQS buckets idle over a day", {"rlqs": {"abandonIdleSecs": 86401}}, ["/rlqs/abandonIdleSecs", "maximum"]),
        ("RLQS table under 64 KiB", {"rlqs": {"maxBytes": 65535}}, ["/rlqs/maxBytes", "minimum"]),
        ("RLQS table over 64 GiB", {"rlqs": {"maxBytes": 68719476737}}, ["/rlqs/maxBytes", "maximum"]),
        ("RLQS table as a quantity", {"rlqs": {"maxBytes": "32Mi"}}, ["/rlqs/maxBytes", "want integer"]),
        ("RLQS key order with an empty key", {"rlqs": {"keyOrder": "tenant,,plan"}},
         ["/rlqs/keyOrder", "does not match pattern"]),
        ("RLQS key order ending in a comma", {"rlqs": {"keyOrder": "tenant,"}}, ["/rlqs/keyOrder", "does not match pattern"]),
        ("RLQS key order naming a key twice", {"rlqs": {"keyOrder": "tenant, plan,tenant"}},
         ['rlqs.keyOrder "tenant, plan,tenant" names "tenant" twice']),
        ("rlqs misspelt key", {"rlqs": {"ttlSecs": 5}}, ["/rlqs", "'ttlSecs' not allowed"]),
        ("env sets an RLQS variable", {"env": {"SLUICE_RLQS_MAX_BYTES": "65536"}},
         ["env.SLUICE_RLQS_MAX_BYTES is set by the chart"]),
        ("runtime limits' token Secret as a list", {"runtimeLimits": {"adminTokens": {"existingSecret": ["ops"]}}},
         ["/runtimeLimits/adminTokens/existingSecret", "want string"]),
        ("runtime limits' token key empty", {"runtimeLimits": {"adminTokens": {"existingSecretKey": ""}}},
         ["/runtimeLimits/adminTokens/existingSecretKey", "does not match pattern"]),
        ("runtimeLimits misspelt key", {"runtimeLimits": {"adminToken": {"existingSecret": "ops"}}},
         ["/runtimeLimits", "'adminToken' not allowed"]),
        ("env sets the admin token file", {"env": {"SLUICE_ADMIN_TOKEN_FILE": "/tmp/tokens"}},
         ["env.SLUICE_ADMIN_TOKEN_FILE is set by the chart"]),
        ("runtime limits' file on a ReadWriteOnce claim for three pods",
         {"replicaCount": 3, "updateStrategy": {"type": "Recreate"}, "runtimeLimits": {"persistence": {"enabled": True}}},
         ["runtimeLimits.persistence.enabled keeps one pod's runtime limits in one file on one claim, but replicaCount is 3",
          "ReadWriteOnce", "Redis (backend: redis)", "peers (cluster.enabled)"]),
        ("runtime limits' file with the HPA",
         {"autoscaling": {"enabled": True}, "updateStrategy": {"type": "Recreate"},
          "runtimeLimits": {"persistence": {"enabled": True}}},
         ["runtimeLimits.persistence.enabled", "autoscaling.enabled may run several pods", "Redis (backend: redis)"]),
        ("runtime limits' file on a ReadWriteMany claim for two pods",
         {"replicaCount": 2, "updateStrategy": {"type": "Recreate"},
          "runtimeLimits": {"persistence": {"enabled": True, "accessModes": ["ReadWriteMany"]}}},
         ["but replicaCount is 2", "pods sharing one file would overwrite one another's limits"]),
        ("runtime limits' file with a rolling update", {"runtimeLimits": {"persistence": {"enabled": True}}},
         ["runtimeLimits.persistence.enabled needs updateStrategy.type: Recreate"]),
        ("runtime limits' file with backend: redis",
         {"backend": "redis", "redis": {"url": "r:6379"}, "updateStrategy": {"type": "Recreate"},
          "runtimeLimits": {"persistence": {"enabled": True}}},
         ["runtimeLimits.persistence.enabled with backend: redis", "need no volume"]),
        ("runtime limits' persistence enabled as a string", {"runtimeLimits": {"persistence": {"enabled": "yes"}}},
         ["/runtimeLimits/persistence/enabled", "want boolean"]),
        ("runtime limits' claim size as a number", {"runtimeLimits": {"persistence": {"size": 1}}},
         ["/runtimeLimits/persistence/size", "want string"]),
        ("runtime limits' claim size not a quantity", {"runtimeLimits": {"persistence": {"size": "1 GB"}}},
         ["/runtimeLimits/persistence/size", "does not match pattern"]),
        ("runtime limits' claim read-only", {"runtimeLimits": {"persistence": {"accessModes": ["ReadOnlyMany"]}}},
         ["/runtimeLimits/persistence/accessModes/0"]),
        ("env sets the runtime limits' file", {"env": {"SLUICE_RUNTIME_LIMITS_PATH": "/tmp/limits.json"}},
         ["env.SLUICE_RUNTIME_LIMITS_PATH is set by the chart"]),
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

    # The binary reads the files under the rendered paths: a key that does not match the
    # certificate there stops it (exit 64) naming the variable and the file.
    with tempfile.TemporaryDirectory() as tmp:
        env, ports = pod_env(tls_docs, certs, tmp, key_pem=certs["other.key"])
        code, out = start(sluice, env, ports["PORT"])
        if code is None:
            stop(out)
        check(
            "tls-tracing.yaml with a mismatched key in the gRPC TLS Secret: sluice exits 64 naming GRPC_SERVER_TLS_KEY",
            code == 64 and "GRPC_SERVER_TLS_KEY=" in out and "/grpc-tls/tls.key" in out,
            f"exit {code}\n{out if code is not None else ''}",
        )
    cert_tmp.cleanup()
    combo_dir.cleanup()
    memcached.kill()
    memcached.wait()

    print(f"helm: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
