"""``phalanx server manifests``: what a team applies to run the server, validated as strictly as
the job manifests are (``tests/kubernetes/schemas.py``): every object against the API server's own
OpenAPI schemas of the supported versions with unknown fields refused (``kubernetes-validate``),
plus the cross-object rules no schema states (selectors, ports, the service account, the Secret,
Pod Security's "restricted" level). That the Role is enough for the backend's jobs, and that
the backend's RBAC check agrees, is ``tests/kubernetes/test_k8s_server_rbac.py`` (a FAKE API).

The systemd unit: ``systemd-analyze verify`` where it exists (and silent: an unknown key is only
a warning to it), and a strict parse against the keys systemd documents, everywhere."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, phalanx
from tests.kubernetes import schemas

pytest.importorskip("kubernetes_validate", reason="the test extra: pip install -e '.[test]'")

KINDS = ["ServiceAccount", "Role", "RoleBinding", "PersistentVolumeClaim", "Service", "StatefulSet", "Deployment", "Service"]


def render(*args: str) -> list[dict]:
    done = phalanx("server", "manifests", *args, check=True)
    return [o for o in yaml.safe_load_all(done.stdout) if o]


def by(objects: list[dict], kind: str, name: str | None = None) -> dict:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, (kind, name, [o["metadata"]["name"] for o in found])
    return found[0]


def strict(obj: dict) -> None:
    import kubernetes_validate

    for version in schemas.VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)
    assert schemas.DNS_1123_LABEL.match(obj["metadata"]["name"]) and len(obj["metadata"]["name"]) <= 63


def selects(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def restricted(pod: dict) -> None:
    """Pod Security Standards, "restricted" (kubernetes.io/docs/concepts/security/pod-security-standards)."""
    spec = pod["spec"]
    psc = spec.get("securityContext") or {}
    for c in spec["containers"]:
        sc = c.get("securityContext") or {}
        assert sc.get("allowPrivilegeEscalation") is False, c["name"]
        assert sc.get("capabilities", {}).get("drop") == ["ALL"], c["name"]
        assert psc.get("runAsNonRoot") is True or sc.get("runAsNonRoot") is True
        assert (sc.get("runAsUser") or psc.get("runAsUser") or 1) != 0
        assert (psc.get("seccompProfile") or sc.get("seccompProfile") or {}).get("type") in ("RuntimeDefault", "Localhost")
        assert not sc.get("privileged")
    assert not any("hostPath" in v for v in spec.get("volumes", []))


def ports_of(container: dict) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container.get("ports", [])}


def test_server_manifests_validate_strictly_and_fit_together():
    objects = render("--namespace", "team-a", "--image", "registry.example.com/phalanx:1.0", "--store-secret", "pg-store",
                     "--with-postgres")
    assert sorted(o["kind"] for o in objects) == sorted(KINDS)
    for obj in objects:
        strict(obj)
        assert obj["metadata"]["namespace"] == "team-a", obj["metadata"]
    account = by(objects, "ServiceAccount")
    deployment = by(objects, "Deployment")
    spec = deployment["spec"]
    pod = spec["template"]
    # apps/validation: the selector must select the template's labels
    assert selects(spec["selector"]["matchLabels"], pod["metadata"]["labels"])
    schemas._pod(pod, restart=(None, "Always"))
    restricted(pod)
    assert pod["spec"]["serviceAccountName"] == account["metadata"]["name"]
    [server] = pod["spec"]["containers"]
    assert server["image"] == "registry.example.com/phalanx:1.0"
    assert server["command"] == ["phalanx"] and server["args"][0] == "server" and "--store" not in server["args"]
    assert "--insecure-http" in server["args"] and server["args"][server["args"].index("--host") + 1] == "0.0.0.0"
    env = {e["name"]: e for e in server["env"]}
    # the store's URL and its password come from the Secret; neither is written in the objects
    assert env["PHALANX_STORE"]["valueFrom"]["secretKeyRef"] == {"name": "pg-store", "key": "url"}
    assert env["PGPASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "pg-store", "key": "password"}
    assert not any(o["kind"] == "Secret" for o in objects)
    assert "postgresql://" not in yaml.safe_dump_all(objects)
    ports = ports_of(server)
    assert server["readinessProbe"]["httpGet"]["path"] == "/healthz" and server["readinessProbe"]["httpGet"]["port"] in ports
    # liveness is the port only: a database outage makes /healthz 503 and must not restart the server
    assert server["livenessProbe"]["tcpSocket"]["port"] in ports
    assert server["resources"]["requests"] and server["resources"]["limits"]["memory"]
    claim = by(objects, "PersistentVolumeClaim")
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    home = next(m for m in server["volumeMounts"] if env["PHALANX_HOME"]["value"].startswith(m["mountPath"]))
    assert volumes[home["name"]]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert spec["replicas"] == 1 and spec["strategy"]["type"] == "Recreate"  # one ReadWriteOnce home
    service = by(objects, "Service", "phalanx-server")
    assert selects(service["spec"]["selector"], pod["metadata"]["labels"])
    assert all(p["targetPort"] in ports for p in service["spec"]["ports"])
    # RBAC: the binding gives the server's account the Role, in its namespace; the rules are the backend's verbs
    role, binding = by(objects, "Role"), by(objects, "RoleBinding")
    schemas._role(role)
    schemas._role(binding)
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": "team-a"}]
    from phalanx.backends.kubernetes.client import RESOURCES
    from phalanx.server.deploy import rbac_verbs

    granted = {(verb, group, resource) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    wanted = {(verb, RESOURCES[kind].group, RESOURCES[kind].plural + (f"/{sub}" if sub else "")) for verb, kind, sub in rbac_verbs()}
    assert granted == wanted
    for must in [("get", "", "pods/log"), ("create", "batch", "jobs"), ("list", "", "events"), ("create", "jobset.x-k8s.io", "jobsets"),
                 ("delete", "kubeflow.org", "pytorchjobs"), ("patch", "", "secrets"), ("create", "", "services")]:
        assert must in granted, must
    assert not any(r in ("roles", "rolebindings", "nodes", "namespaces", "*") for _, _, r in granted)
    assert not any(v in ("*", "escalate", "bind", "impersonate") for v, _, _ in granted)
    # the example PostgreSQL: its Service is the StatefulSet's, its password the same Secret's
    stateful, pg_service = by(objects, "StatefulSet"), by(objects, "Service", "phalanx-postgres")
    assert stateful["spec"]["serviceName"] == pg_service["metadata"]["name"] and pg_service["spec"]["clusterIP"] == "None"
    pg_pod = stateful["spec"]["template"]
    assert selects(stateful["spec"]["selector"]["matchLabels"], pg_pod["metadata"]["labels"])
    assert selects(pg_service["spec"]["selector"], pg_pod["metadata"]["labels"])
    assert not selects(service["spec"]["selector"], pg_pod["metadata"]["labels"])
    claims = {c["metadata"]["name"] for c in stateful["spec"]["volumeClaimTemplates"]}
    # the StatefulSet controller adds a volume per claim template to each pod
    with_claims = {**pg_pod, "spec": {**pg_pod["spec"], "volumes": [{"name": c, "persistentVolumeClaim": {"claimName": c}}
                                                                     for c in sorted(claims)]}}
    schemas._pod(with_claims, restart=(None, "Always"))
    restricted(pg_pod)
    [pg] = pg_pod["spec"]["containers"]
    assert {e["name"]: e for e in pg["env"]}["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "pg-store",
                                                                                                  "key": "password"}
    assert {m["name"] for m in pg["volumeMounts"]} <= claims
    assert all(p["targetPort"] in ports_of(pg) for p in pg_service["spec"]["ports"])


def test_server_manifests_with_tls_serve_https_in_the_pod():
    objects = render("--tls-secret", "phalanx-tls")
    assert "StatefulSet" not in [o["kind"] for o in objects]
    for obj in objects:
        strict(obj)
        assert obj["metadata"]["namespace"] == "phalanx"
    pod = by(objects, "Deployment")["spec"]["template"]
    [server] = pod["spec"]["containers"]
    assert "--insecure-http" not in server["args"]
    cert, key = server["args"][server["args"].index("--tls-cert") + 1], server["args"][server["args"].index("--tls-key") + 1]
    tls = next(v for v in pod["spec"]["volumes"] if v["name"] == "tls")
    mount = next(m for m in server["volumeMounts"] if m["name"] == "tls")
    assert tls["secret"]["secretName"] == "phalanx-tls" and mount["readOnly"] is True
    assert cert == f"{mount['mountPath']}/tls.crt" and key == f"{mount['mountPath']}/tls.key"  # kubernetes.io/tls keys
    assert server["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert by(objects, "Service")["spec"]["ports"][0]["port"] == 443


@pytest.mark.parametrize("args,named", [
    (["--namespace", "Team_A"], "--namespace"),
    (["--namespace", "x" * 64], "--namespace"),
    (["--image", "bad image"], "--image"),
    (["--image", ""], "--image"),
    (["--store-secret", "Bad/Secret"], "--store-secret"),
    (["--tls-secret", "UPPER"], "--tls-secret"),
    (["--systemd", "--with-postgres"], "--systemd"),
])
def test_server_manifests_bad_input_is_one_line_and_exit_2(args, named):
    done = phalanx("server", "manifests", *args)
    assert done.returncode == 2, done
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and "Traceback" not in done.stderr, done.stderr


def unit_text() -> str:
    return phalanx("server", "manifests", "--systemd", check=True).stdout


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here (the strict parse below still runs)")
def test_systemd_unit_systemd_analyze_verify(tmp_path):
    unit = tmp_path / "phalanx-server.service"
    unit.write_text(unit_text())
    done = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=120)
    # an unknown key or a bad value is only a warning to verify: the unit must draw none
    assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), done


# The keys systemd documents (systemd.unit(5), systemd.service(5), systemd.exec(5), systemd.kill(5),
# systemd.resource-control(5)) that a unit of this kind may use; anything else is a typo.
KNOWN = {
    "Unit": {"Description", "Documentation", "Wants", "Requires", "Requisite", "BindsTo", "PartOf", "Upholds", "Conflicts",
             "Before", "After", "OnFailure", "OnSuccess", "StartLimitIntervalSec", "StartLimitBurst", "ConditionPathExists",
             "AssertPathExists"},
    "Service": {"Type", "ExitType", "RemainAfterExit", "PIDFile", "BusName", "ExecStart", "ExecStartPre", "ExecStartPost",
                "ExecCondition", "ExecReload", "ExecStop", "ExecStopPost", "RestartSec", "TimeoutStartSec", "TimeoutStopSec",
                "TimeoutSec", "RuntimeMaxSec", "WatchdogSec", "Restart", "SuccessExitStatus", "RestartPreventExitStatus",
                "NotifyAccess", "User", "Group", "DynamicUser", "SupplementaryGroups", "WorkingDirectory",
                "RootDirectory", "Environment", "EnvironmentFile", "PassEnvironment", "UMask", "StateDirectory",
                "RuntimeDirectory", "CacheDirectory", "LogsDirectory", "ConfigurationDirectory", "StateDirectoryMode",
                "KillMode", "KillSignal", "SendSIGKILL", "FinalKillSignal", "NoNewPrivileges", "PrivateTmp",
                "PrivateDevices", "ProtectSystem", "ProtectHome", "ProtectKernelTunables", "ProtectKernelModules",
                "ProtectControlGroups", "ReadWritePaths", "ReadOnlyPaths", "LimitNOFILE", "LimitNPROC", "MemoryMax",
                "CPUQuota", "TasksMax", "StandardOutput", "StandardError", "SyslogIdentifier", "Delegate"},
    "Install": {"WantedBy", "RequiredBy", "Alias", "Also", "DefaultInstance"},
}
VALUES = {"Type": {"simple", "exec", "forking", "oneshot", "dbus", "notify", "idle"},
          "KillMode": {"control-group", "mixed", "process", "none"},
          "Restart": {"no", "on-success", "on-failure", "on-abnormal", "on-watchdog", "on-abort", "always"},
          "ProtectSystem": {"yes", "no", "full", "strict"}, "ProtectHome": {"yes", "no", "read-only", "tmpfs"},
          "NoNewPrivileges": {"yes", "no"}, "PrivateTmp": {"yes", "no"}}


def parse_unit(text: str) -> dict[str, list[tuple[str, str]]]:
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith(("#", ";")):
            continue
        assert not line.endswith("\\"), f"line {number}: a continued line"
        header = re.fullmatch(r"\[([A-Za-z]+)\]", line)
        if header:
            assert header[1] not in sections, f"line {number}: section [{header[1]}] twice"
            current = sections.setdefault(header[1], [])
            continue
        assert current is not None, f"line {number}: a key before any section"
        key, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Za-z]+", key) and value.strip(), f"line {number}: not KEY=VALUE: {line!r}"
        current.append((key, value))
    return sections


def test_systemd_unit_strict_parse_of_sections_and_keys():
    sections = parse_unit(unit_text())
    assert set(sections) == {"Unit", "Service", "Install"}
    for name, pairs in sections.items():
        for key, value in pairs:
            assert key in KNOWN[name], f"[{name}] {key}: not a key systemd documents for this section"
            if key in VALUES:
                assert value in VALUES[key], f"{key}={value}"
    service = dict(sections["Service"])  # the repeatable ones (Environment) are checked as a list below
    exe, *args = service["ExecStart"].split()
    assert Path(exe).is_absolute() and args[0] == "server"
    assert "--store" not in args  # the URL (and PGPASSWORD) come from the EnvironmentFile, not argv
    assert service["KillMode"] == "process"  # the jobs' supervisors live on when the server stops
    assert service["User"] != "root" and service["EnvironmentFile"].startswith("/etc/")
    assert any(v.startswith("PHALANX_HOME=") for k, v in sections["Service"] if k == "Environment")
    assert dict(sections["Install"])["WantedBy"] == "multi-user.target"


def test_systemd_unit_is_the_one_in_the_docs():
    printed = unit_text()
    docs = (ROOT / "docs" / "server.md").read_text()
    block = re.search(r"```ini\n(\[Unit\].*?)```", docs, re.S)
    assert block, "docs/server.md shows the unit in an ```ini block"
    normal = [re.sub(r"^ExecStart=\S+", "ExecStart=PHALANX", line) for line in printed.splitlines()]
    shown = [re.sub(r"^ExecStart=\S+", "ExecStart=PHALANX", line) for line in block[1].splitlines()]
    assert shown == normal
