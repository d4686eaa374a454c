"""Checks of deploy/: every artefact is validated by the tool its runtime would use, offline.

- the Procfile is the one process list: compose, Kubernetes, systemd and the image's defaults run
  exactly its commands, and each command is accepted by its program;
- compose.yaml against the Compose Specification schema (shipped by check-jsonschema);
- Kubernetes manifests against the Kubernetes OpenAPI schemas (shipped by kubernetes-validate),
  with the network switched off so a schema fetched from the internet would fail the test;
- alert rules with `promtool check rules` and `promtool test rules`, the scrape config with
  `promtool check config`;
- every metric named in an alert or a dashboard query is one deploy/metrics.txt promises, and the
  series every ingress replica reads from the store alike are aggregated with max, never summed;
- systemd units with `systemd-analyze verify` (skipped where systemd is not installed).
"""

from __future__ import annotations

import base64
import importlib.resources
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import urllib.parse
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from honcho.environ import parse_procfile

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
SYSTEMD = DEPLOY / "systemd"
PROMETHEUS = DEPLOY / "prometheus"

# The oldest Kubernetes the manifests claim to support (preStop `sleep` is on by default from 1.30),
# and the newest the installed kubernetes-validate knows.
K8S_VERSIONS = ("1.30", kubernetes_validate.utils.latest_version())

# Where each Procfile process runs in compose, Kubernetes and systemd.
PROCESS_TARGETS = {
    #  Procfile   compose service   k8s (kind, name)                 systemd unit
    "release": ("migrate", ("Job", "openhub-migrate"), "openhub-migrate.service"),
    "ingress": ("ingress", ("Deployment", "openhub-ingress"), "openhub-ingress.service"),
    "worker": ("worker", ("Deployment", "openhub-worker"), "openhub-worker@.service"),
    "worker-gevent": ("worker-gevent", ("Deployment", "openhub-worker-gevent"), "openhub-worker-gevent@.service"),
    "confirmer": ("confirmer", ("Deployment", "openhub-confirmer"), "openhub-confirmer.service"),
    "beat": ("beat", ("Deployment", "openhub-beat"), "openhub-beat.service"),
    "flower": ("flower", ("Deployment", "openhub-flower"), "openhub-flower.service"),
    "archive": ("archive", ("CronJob", "openhub-archive"), "openhub-archive.service"),
    "prune": ("prune", ("CronJob", "openhub-exchanges-prune"), "openhub-exchanges-prune.service"),
}
LONG_RUNNING = ("ingress", "worker", "confirmer", "beat", "flower")
HEARTBEAT_MAX_AGE = 120  # seconds; the worker touches its heartbeat file at least every 30 s


# --------------------------------------------------------------------------- helpers


def read_procfile(path: Path = DEPLOY / "Procfile") -> dict[str, str]:
    """The Procfile's processes as {name: command}, parsed by honcho itself."""
    return {name: command.strip() for name, command in parse_procfile(path.read_text()).processes.items()}


def normalise_argv(argv: list[str]) -> list[str]:
    """One spelling for a command line: program without its directory, variables as ${NAME}.

    Compose and the shell write `$NAME` or `${NAME}`, Kubernetes `$(NAME)`, systemd `${NAME}`.
    """
    if not argv:
        return argv
    argv = [Path(argv[0]).name, *argv[1:]]
    return [
        re.sub(r"\$(?:\{(\w+)\}|\((\w+)\)|(\w+))", lambda m: "${%s}" % next(g for g in m.groups() if g), a)
        for a in argv
    ]


def load_yaml_documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def k8s_manifests() -> list[tuple[Path, dict]]:
    """Every Kubernetes resource in deploy/k8s (the kustomization file is not a resource)."""
    return [
        (path, doc)
        for path in sorted(K8S.glob("*.yaml"))
        if path.name != "kustomization.yaml"
        for doc in load_yaml_documents(path)
    ]


def k8s_resource(kind: str, name: str) -> dict:
    found = [doc for _, doc in k8s_manifests() if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name} in deploy/k8s, found {len(found)}"
    return found[0]


def pod_spec(resource: dict) -> dict:
    if resource["kind"] == "CronJob":
        return resource["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return resource["spec"]["template"]["spec"]


def compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def systemd_unit(name: str) -> dict[str, list[str]]:
    """A unit file as {"Section.Key": [values...]}."""
    values: dict[str, list[str]] = {}
    section = ""
    for raw in (SYSTEMD / name).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        values.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return values


def step_timeout_seconds() -> float:
    return float(k8s_resource("ConfigMap", "openhub-config")["data"]["OPENHUB_STEP_TIMEOUT"])


def seconds(duration: str) -> float:
    """Compose durations such as 330s, 5m30s, 1h."""
    total = 0.0
    for amount, unit in re.findall(r"(\d+(?:\.\d+)?)(ms|us|s|m|h)", duration):
        total += float(amount) * {"us": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}[unit]
    return total


# --------------------------------------------------------------------------- one process list


def test_deploy_procfile_lists_every_process():
    processes = read_procfile()
    assert set(processes) == set(PROCESS_TARGETS)
    # The commands README.md and openhub/api/README.md ("Command line") name (issue 6), verbatim.
    assert processes["release"] == "openhub db upgrade"
    assert processes["ingress"].startswith("openhub serve ")
    assert processes["worker"].startswith("celery -A tasks worker")
    assert processes["beat"].startswith("celery -A tasks beat")
    assert processes["flower"].startswith("celery -A tasks flower")
    assert processes["archive"].startswith("openhub archive ")
    assert processes["prune"] == "openhub exchanges prune"


@pytest.mark.parametrize("process", sorted(PROCESS_TARGETS))
def test_deploy_compose_runs_the_procfile_command(process):
    service_name = PROCESS_TARGETS[process][0]
    command = compose()["services"][service_name]["command"]
    argv = shlex.split(command) if isinstance(command, str) else command
    assert normalise_argv(argv) == normalise_argv(shlex.split(read_procfile()[process]))


@pytest.mark.parametrize("process", sorted(PROCESS_TARGETS))
def test_deploy_kubernetes_runs_the_procfile_command(process):
    kind, name = PROCESS_TARGETS[process][1]
    (container,) = pod_spec(k8s_resource(kind, name))["containers"]
    argv = container["command"] + container.get("args", [])
    assert normalise_argv(argv) == normalise_argv(shlex.split(read_procfile()[process]))


@pytest.mark.parametrize("process", sorted(PROCESS_TARGETS))
def test_deploy_systemd_runs_the_procfile_command(process):
    (exec_start,) = systemd_unit(PROCESS_TARGETS[process][2])["Service.ExecStart"]
    assert exec_start.startswith("/"), "systemd wants an absolute program path"
    assert normalise_argv(shlex.split(exec_start)) == normalise_argv(shlex.split(read_procfile()[process]))


def test_deploy_runs_no_command_outside_the_procfile():
    """Nothing in compose, k8s or systemd starts an openhub/celery command the Procfile lacks."""
    known = {tuple(normalise_argv(shlex.split(c))) for c in read_procfile().values()}
    found: list[tuple[str, list[str]]] = []
    for name, service in compose()["services"].items():
        if "command" in service and "image" in service and "openhub" in service["image"]:
            command = service["command"]
            found.append((f"compose {name}", shlex.split(command) if isinstance(command, str) else command))
    for path, doc in k8s_manifests():
        if doc["kind"] in ("Deployment", "Job", "CronJob", "StatefulSet", "DaemonSet"):
            for container in pod_spec(doc)["containers"]:
                if container["image"].startswith("openhub"):  # not the OpenTelemetry collector's
                    found.append((f"{path.name} {container['name']}", container["command"] + container.get("args", [])))
    for unit in sorted(SYSTEMD.glob("*.service")):
        for exec_start in systemd_unit(unit.name).get("Service.ExecStart", []):
            found.append((unit.name, shlex.split(exec_start)))
    assert found
    strays = [
        (where, argv)
        for where, argv in found
        if argv and Path(argv[0]).name in ("openhub", "celery") and tuple(normalise_argv(argv)) not in known
    ]
    assert not strays, f"commands not in deploy/Procfile: {strays}"


@pytest.mark.parametrize("process", sorted(PROCESS_TARGETS))
def test_deploy_procfile_commands_are_accepted_by_their_programs(process, tmp_path):
    """Each command's program knows its subcommand and options (`--help` after them exits 0)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OPENHUB_VAR_DIR": str(tmp_path / "var"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "FLOWER_BASIC_AUTH": "user:password",
    }
    result = subprocess.run(
        f"{read_procfile()[process]} --help", shell=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]


def test_deploy_normalise_argv_spellings_agree():
    assert (
        normalise_argv(["/opt/venv/bin/celery", "--basic-auth=${U}:${P}"])
        == normalise_argv(["celery", "--basic-auth=$(U):$(P)"])
        == normalise_argv(["celery", "--basic-auth=$U:$P"])
    )
    assert normalise_argv(["celery", "--basic-auth=$U"]) != normalise_argv(["celery", "--basic-auth=$V"])


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of deploy/Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n(\s*#[^\n]*\n)*", " ", (DEPLOY / "Dockerfile").read_text())
    result = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instruction, _, arguments = line.partition(" ")
            result.append((instruction.upper(), arguments.strip()))
    return result


def test_deploy_dockerfile_copies_what_exists_and_runs_procfile_commands():
    """The image is never built here (no Docker engine); check what can be checked without one."""
    instructions = dockerfile_instructions()
    sources = [a.split()[:-1] for i, a in instructions if i == "COPY" and not a.startswith("--from")]
    missing = [src for args in sources for src in args if not (ROOT / src).exists()]
    assert not missing, f"the Dockerfile copies files the build context lacks: {missing}"
    ignored = {
        line.strip()
        for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert not {src for args in sources for src in args} & ignored, "copying an ignored path"
    # Both CMDs (runtime: ingress, archive target: archive) are Procfile commands.
    commands = [normalise_argv(json.loads(a)) for i, a in instructions if i == "CMD"]
    procfile = read_procfile()
    assert commands == [
        normalise_argv(shlex.split(procfile["ingress"])),
        normalise_argv(shlex.split(procfile["archive"])),
    ]
    stages = [a.split()[-1] for i, a in instructions if i == "FROM"]
    assert stages == ["build", "runtime", "archive"]
    assert compose()["services"]["ingress"]["build"]["target"] == "runtime"
    assert compose()["services"]["archive"]["build"]["target"] == "archive"
    users = [a for i, a in instructions if i == "USER"]
    assert users[-1] != "root" and users[-1] != "0", "the image must not run as root"


# --------------------------------------------------------------------------- compose


def compose_schema() -> dict:
    # check-jsonschema vendors the Compose Specification's JSON schema and keeps it current.
    try:
        vendor = importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
    except ModuleNotFoundError:
        pytest.fail("check-jsonschema is not installed: it belongs in pyproject's dev extra")
    return json.loads(vendor.joinpath("compose-spec.json").read_text())


def test_deploy_compose_file_matches_the_compose_specification():
    validator = jsonschema.Draft202012Validator(compose_schema())
    errors = [f"{e.json_path}: {e.message}" for e in validator.iter_errors(compose())]
    assert not errors, "\n".join(errors)


def test_deploy_compose_schema_rejects_a_broken_file():
    """The schema check can fail: a misspelt key and a wrong type are both reported."""
    broken = compose()
    broken["services"]["worker"]["stop_grace_periode"] = "330s"
    broken["services"]["ingress"]["ports"] = 8000  # must be a list
    errors = list(jsonschema.Draft202012Validator(compose_schema()).iter_errors(broken))
    assert len(errors) >= 2


def test_deploy_compose_services_and_policies():
    services = compose()["services"]
    assert {"postgres", "redis", "migrate", "ingress", "worker", "beat", "flower"} <= set(services)

    redis_command = " ".join(services["redis"]["command"])
    assert "--appendonly yes" in redis_command
    assert "--maxmemory-policy noeviction" in redis_command
    assert "redis-data:/data" in services["redis"]["volumes"]

    for name in ("postgres", "redis", "ingress", "worker", "flower"):
        assert "healthcheck" in services[name], f"{name} has no health check"
    for name, service in services.items():
        assert service.get("restart"), f"{name} has no restart policy"
    assert services["migrate"]["restart"].startswith("on-failure")

    # The migration runs first; nothing that uses the schema starts before it succeeded.
    for name in ("ingress", "worker", "beat"):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"

    assert services["beat"]["deploy"]["replicas"] == 1
    assert "container_name" not in services["worker"], "a fixed container name prevents --scale"
    assert seconds(services["worker"]["stop_grace_period"]) > step_timeout_seconds()
    assert str(HEARTBEAT_MAX_AGE) in " ".join(services["worker"]["healthcheck"]["test"])
    env = compose_env_defaults(services["worker"]["environment"])
    assert float(env["OPENHUB_VISIBILITY_TIMEOUT"]) > float(env["OPENHUB_STEP_TIMEOUT"]), (
        "Redis would re-deliver a step that is still running"
    )
    assert env["OPENHUB_VAR_DIR"].startswith("/tmp/"), "the image's /app is not writable"
    # Flower: reachable from this host only, its login from the environment, not the command line.
    flower = services["flower"]
    assert "--basic-auth" not in flower["command"] and "FLOWER_BASIC_AUTH" in flower["environment"]
    assert all(str(p).startswith("127.0.0.1:") for p in flower["ports"]), flower["ports"]
    commands = [
        *read_procfile().values(),
        open(K8S / "flower.yaml").read(),
        (DEPLOY / "systemd" / "openhub-flower.service").read_text(),
    ]
    assert not [c for c in commands if "basic-auth" in c or "PASSWORD" in c]


def compose_env_defaults(environment: dict) -> dict[str, str]:
    """The values compose would use with an empty .env: `${X:-default}` becomes default."""
    return {k: re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(v)) for k, v in environment.items()}


def hub_setting_names() -> set[str]:
    """Every OPENHUB_* name the hub's processes read: the library (not its dev/testing helpers),
    the Celery app and celeryconfig.py. A new setting there must reach .env.example."""
    sources = [
        ROOT / "celeryconfig.py",
        *sorted((ROOT / "tasks").rglob("*.py")),
        *(p for p in sorted((ROOT / "openhub").rglob("*.py")) if p.name not in ("dev.py", "testing.py")),
    ]
    names = set()
    for source in sources:
        names |= set(re.findall(r"[\"'](OPENHUB_[A-Z][A-Z0-9_]*)[\"']", source.read_text()))
    assert {"OPENHUB_DATABASE_URL", "OPENHUB_BROKER_URL", "OPENHUB_WORKER_HEARTBEAT_FILE"} <= names
    return names


def tracing_variable_names() -> set[str]:
    """The standard OTEL_* variables a deployment sets for the hub (openhub.core.tracing.STANDARD_VARIABLES)."""
    source = (ROOT / "openhub" / "core" / "tracing.py").read_text()
    block = source.split("STANDARD_VARIABLES = (", 1)[1].split(")", 1)[0]
    names = set(re.findall(r"\"(OTEL_[A-Z_]+)\"", block))
    assert {"OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SERVICE_NAME"} <= names
    return names


def test_deploy_compose_configures_the_hub_only_through_openhub_variables():
    services = compose()["services"]
    settings = hub_setting_names() | tracing_variable_names()
    for name in ("migrate", "ingress", "worker", "beat", "flower", "archive"):
        environment = services[name]["environment"]
        for key in environment:
            assert key.startswith(("OPENHUB_", "FLOWER_", "OTEL_")), f"{name}: {key} is not an OPENHUB_* setting"
            if key.startswith("OTEL_"):
                assert key in settings, f"{name}: {key} is not a tracing variable openhub documents"
            if key.startswith("OPENHUB_"):
                assert key in settings, f"{name}: {key} is not a setting openhub reads"
        assert {"OPENHUB_DATABASE_URL", "OPENHUB_BROKER_URL"} <= set(environment)


def env_example_names() -> set[str]:
    text = (DEPLOY / ".env.example").read_text()
    return set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]*)=", text, flags=re.MULTILINE))


def test_deploy_env_example_documents_every_variable():
    documented = env_example_names()
    interpolated = set(re.findall(r"\$\{?([A-Z][A-Z0-9_]*)", (DEPLOY / "compose.yaml").read_text()))
    assert not interpolated - documented, "compose variables missing from .env.example"
    assert not hub_setting_names() - documented, "hub settings missing from .env.example"


# --------------------------------------------------------------------------- Kubernetes


@pytest.fixture
def no_network(monkeypatch):
    """Fail any attempt to reach the network: validation must work offline."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def k8s_errors(doc: dict, version: str) -> str | None:
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        path = ".".join(str(p) for p in error.path)
        return f"{doc['kind']}/{doc['metadata'].get('name')}: {path}: {error.message}"
    except kubernetes_validate.SchemaNotFoundError as error:
        return f"{doc['kind']}/{doc['metadata'].get('name')}: {error.message}"
    return None


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_deploy_kubernetes_manifests_match_the_schemas_offline(version, no_network):
    manifests = k8s_manifests()
    assert len(manifests) >= 12
    errors = [e for _, doc in manifests if (e := k8s_errors(doc, version))]
    assert not errors, "\n".join(errors)


def test_deploy_kubernetes_validation_rejects_broken_manifests(no_network):
    """The schema check can fail: unknown field, wrong type, unknown kind."""
    worker = k8s_resource("Deployment", "openhub-worker")
    misspelt = json.loads(json.dumps(worker))
    misspelt["spec"]["template"]["spec"]["terminationGracePeriod"] = 330
    wrong_type = json.loads(json.dumps(worker))
    wrong_type["spec"]["replicas"] = "two"
    unknown_kind = {"apiVersion": "apps/v1", "kind": "Deploymnet", "metadata": {"name": "x"}}
    for doc in (misspelt, wrong_type, unknown_kind):
        assert k8s_errors(doc, K8S_VERSIONS[0]) is not None, doc


def test_deploy_kustomization_lists_every_manifest():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk


def test_deploy_kubernetes_resources_set_everywhere():
    containers = [
        (path.name, c)
        for path, doc in k8s_manifests()
        if doc["kind"] in ("Deployment", "Job", "CronJob")
        for c in pod_spec(doc)["containers"]
    ]
    assert len(containers) == 10  # 9 processes of the hub and the OpenTelemetry collector
    for where, container in containers:
        for bound in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(container["resources"].get(bound, {})), f"{where}: {bound}"
        if not container["image"].startswith("openhub"):
            continue  # the collector reads none of the hub's settings
        sources = {next(iter(s)): next(iter(s.values()))["name"] for s in container["envFrom"]}
        assert sources == {"configMapRef": "openhub-config", "secretRef": "openhub-secrets"}, where
        if container.get("securityContext", {}).get("readOnlyRootFilesystem"):
            mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
            assert "/tmp" in mounts, f"{where}: read-only root needs a writable /tmp"


def every_container() -> list[tuple[str, dict, dict]]:
    """(where, pod spec, container) for every container and init container in deploy/k8s."""
    return [
        (f"{path.name} {c['name']}", pod_spec(doc), c)
        for path, doc in k8s_manifests()
        if doc["kind"] in ("Deployment", "Job", "CronJob", "StatefulSet", "DaemonSet")
        for c in pod_spec(doc).get("initContainers", []) + pod_spec(doc)["containers"]
    ]


def test_deploy_kubernetes_containers_drop_every_capability_and_run_as_non_root():
    """Issue 27: no container keeps Linux capabilities, can gain privileges or runs as root."""
    containers = every_container()
    assert len(containers) == 11  # 9 processes, Flower's login check and the OpenTelemetry collector
    for where, pod, container in containers:
        context = container.get("securityContext", {})
        assert context.get("capabilities", {}).get("drop") == ["ALL"], where
        assert context.get("allowPrivilegeEscalation") is False, where
        assert context.get("runAsNonRoot", pod.get("securityContext", {}).get("runAsNonRoot")) is True, where


def selects(policy: dict, labels: dict[str, str]) -> bool:
    return policy["spec"]["podSelector"].get("matchLabels", {}).items() <= labels.items()


def test_deploy_kubernetes_network_policy_opens_only_the_api_and_flower_ports():
    """Issue 27: ingress to the API on its port, to Flower on its; none to workers, beat or jobs; egress open."""
    policies = [doc for _, doc in k8s_manifests() if doc["kind"] == "NetworkPolicy"]
    assert policies and all(p["spec"]["policyTypes"] == ["Ingress"] for p in policies), (
        "egress stays open: steps call external systems anywhere"
    )
    opened = {}
    for _, doc in k8s_manifests():
        if doc["kind"] not in ("Deployment", "Job", "CronJob"):
            continue
        template = (
            doc["spec"]["jobTemplate"]["spec"]["template"] if doc["kind"] == "CronJob" else doc["spec"]["template"]
        )
        labels = template["metadata"]["labels"]
        mine = [p for p in policies if selects(p, labels)]
        assert mine, f"{doc['metadata']['name']}: no NetworkPolicy selects its pods (all ingress allowed)"
        ports = {port["port"] for p in mine for rule in p["spec"].get("ingress", []) for port in rule.get("ports", [])}
        assert all(rule.get("ports") for p in mine for rule in p["spec"].get("ingress", [])), "a rule opens every port"
        opened[doc["metadata"]["name"]] = ports
        container_ports = {p["containerPort"] for c in pod_spec(doc)["containers"] for p in c.get("ports", [])}
        assert ports <= container_ports, f"{doc['metadata']['name']}: opens a port it does not serve"
    assert opened.pop("openhub-ingress") == {8000} and opened.pop("openhub-flower") == {5555}
    assert opened.pop("openhub-otel-collector") == {4317, 4318}  # from the hub's pods only (below)
    (collector,) = [p for p in policies if p["metadata"]["name"] == "openhub-otel-collector"]
    assert [rule["from"] for rule in collector["spec"]["ingress"]] == [
        [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "openhub"}}}]
    ]
    assert not any(opened.values()), f"pods that must accept no connections do: {opened}"


def k8s_secret_example() -> dict[str, str]:
    """The names and placeholder values of secrets.env.example, from which the Secret is generated."""
    lines = (K8S / "secrets.env.example").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


def kustomize(directory: Path) -> subprocess.CompletedProcess:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    return subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60)


def test_deploy_kubernetes_secret_is_generated_never_applied_from_placeholders(tmp_path):
    assert not [path for path, doc in k8s_manifests() if doc["kind"] == "Secret"], "a Secret manifest in deploy/k8s"
    copy = tmp_path / "k8s"
    shutil.copytree(K8S, copy, ignore=shutil.ignore_patterns("secrets.env"))
    missing = kustomize(copy)
    assert missing.returncode != 0 and "secrets.env" in missing.stderr  # no file, no apply
    real = {name: f"value-{i}-" + "x" * 40 for i, name in enumerate(k8s_secret_example())}
    (copy / "secrets.env").write_text("".join(f"{k}={v}\n" for k, v in real.items()))
    rendered = kustomize(copy)
    assert rendered.returncode == 0, rendered.stderr
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    (secret,) = [d for d in docs if d["kind"] == "Secret"]
    assert secret["metadata"]["name"].startswith("openhub-secrets-")  # content hash: pods roll on change
    assert "change-me" not in rendered.stdout
    refs = {
        s["secretRef"]["name"]
        for d in docs
        if d["kind"] in ("Deployment", "Job", "CronJob")
        for c in pod_spec(d)["containers"]
        for s in c.get("envFrom", [])
        if "secretRef" in s
    }
    assert refs == {secret["metadata"]["name"]}
    for real_file in ("deploy/k8s/secrets.env", "deploy/.env"):
        ignored = subprocess.run(["git", "check-ignore", "-q", real_file], cwd=ROOT)
        assert ignored.returncode == 0, f"{real_file} holds real secrets: it must be git-ignored"


def test_deploy_kubernetes_configuration_is_openhub_variables():
    settings = hub_setting_names()
    config = k8s_resource("ConfigMap", "openhub-config")["data"]
    secret = k8s_secret_example()
    assert set(config) <= settings | tracing_variable_names()
    assert float(config["OPENHUB_VISIBILITY_TIMEOUT"]) > float(config["OPENHUB_STEP_TIMEOUT"])
    # The root filesystem is read-only: scratch files must land on the /tmp emptyDir.
    assert config["OPENHUB_VAR_DIR"].startswith("/tmp/")
    assert config["OPENHUB_WORKER_HEARTBEAT_FILE"].startswith("/tmp/")
    assert set(secret) - {"FLOWER_BASIC_AUTH"} <= settings
    assert {"OPENHUB_DATABASE_URL", "OPENHUB_API_KEYS", "OPENHUB_ADMIN_TOKEN"} <= set(secret)
    assert not set(config) & set(secret)


def test_deploy_kubernetes_probes_and_shutdown():
    (ingress,) = pod_spec(k8s_resource("Deployment", "openhub-ingress"))["containers"]
    assert ingress["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert ingress["livenessProbe"]["httpGet"]["path"] == "/healthz"

    worker_pod = pod_spec(k8s_resource("Deployment", "openhub-worker"))
    (worker,) = worker_pod["containers"]
    probe = " ".join(worker["livenessProbe"]["exec"]["command"])
    assert "OPENHUB_WORKER_HEARTBEAT_FILE" in probe and f"> {HEARTBEAT_MAX_AGE}" in probe
    assert worker_pod["terminationGracePeriodSeconds"] > step_timeout_seconds()

    beat = k8s_resource("Deployment", "openhub-beat")
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"]["type"] == "Recreate"

    hpa = k8s_resource("HorizontalPodAutoscaler", "openhub-worker")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "openhub-worker"}
    assert k8s_resource("CronJob", "openhub-archive")["spec"]["concurrencyPolicy"] == "Forbid"


def test_deploy_worker_heartbeat_probe_is_the_same_everywhere(tmp_path):
    """The probe compose and Kubernetes run passes on a fresh heartbeat and fails on a stale one."""
    (worker,) = pod_spec(k8s_resource("Deployment", "openhub-worker"))["containers"]
    k8s_probe = worker["livenessProbe"]["exec"]["command"]
    compose_probe = compose()["services"]["worker"]["healthcheck"]["test"][1:]  # after "CMD"
    assert k8s_probe == compose_probe
    heartbeat = tmp_path / "heartbeat"
    heartbeat.touch()
    env = {"OPENHUB_WORKER_HEARTBEAT_FILE": str(heartbeat), "PATH": "/usr/bin:/bin"}
    probe = [shutil.which("python3") or "python3", *k8s_probe[1:]]
    assert subprocess.run(probe, env=env).returncode == 0
    stale = heartbeat.stat().st_mtime - HEARTBEAT_MAX_AGE - 10
    os.utime(heartbeat, (stale, stale))
    assert subprocess.run(probe, env=env).returncode != 0
    heartbeat.unlink()
    assert subprocess.run(probe, env=env, stderr=subprocess.DEVNULL).returncode != 0


def test_deploy_services_select_their_pods():
    deployments = {d["metadata"]["name"]: d for _, d in k8s_manifests() if d["kind"] == "Deployment"}
    services = [d for _, d in k8s_manifests() if d["kind"] == "Service"]
    assert {s["metadata"]["name"] for s in services} == {"openhub-ingress", "openhub-flower", "openhub-otel-collector"}
    for service in services:
        target = deployments[service["metadata"]["name"]]
        labels = target["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items()
        (container,) = pod_spec(target)["containers"]
        port_names = {p["name"] for p in container["ports"]}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names


def test_deploy_hub_exports_traces_to_the_collector_in_compose_and_kubernetes():
    """Issue 23: the hub's OTLP endpoint is the collector's OTLP/HTTP receiver, and the collector's
    pipeline receives OTLP and exports it; Kubernetes runs the compose configuration but its exporter.
    Issue 34 M2/M3: tracing is off until turned on, and propagates no baggage."""
    collector = yaml.safe_load((DEPLOY / "otel" / "collector.yaml").read_text())
    http_port = int(collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"].rsplit(":", 1)[1])
    assert collector["service"]["pipelines"]["traces"]["receivers"] == ["otlp"]
    services = compose()["services"]
    env = compose_env_defaults(services["worker"]["environment"])
    assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf"
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == f"http://otel-collector:{http_port}"
    assert "./otel/collector.yaml:/etc/otelcol/config.yaml:ro" in services["otel-collector"]["volumes"]
    (exporter,) = collector["service"]["pipelines"]["traces"]["exporters"]
    assert collector["exporters"][exporter]["endpoint"].split(":")[0] in services
    assert "{trace_id}" in env["OPENHUB_TRACE_URL"]

    config = k8s_resource("ConfigMap", "openhub-config")["data"]
    service = k8s_resource("Service", "openhub-otel-collector")
    assert config["OTEL_EXPORTER_OTLP_ENDPOINT"] == f"http://{service['metadata']['name']}:{http_port}"
    assert http_port in {p["port"] for p in service["spec"]["ports"]}
    k8s_collector = yaml.safe_load(k8s_resource("ConfigMap", "openhub-otel-collector")["data"]["config.yaml"])
    assert {k: v for k, v in k8s_collector.items() if k != "exporters"} == {
        k: v for k, v in collector.items() if k != "exporters"
    }
    assert "{trace_id}" in config["OPENHUB_TRACE_URL"]
    example = dict(
        line.split("=", 1) for line in (DEPLOY / ".env.example").read_text().splitlines() if line.startswith("OTEL_")
    )
    for where, values in (("compose", env), ("k8s", config), (".env.example", example)):
        assert values["OTEL_TRACES_EXPORTER"] == "none", where
        assert values["OTEL_PROPAGATORS"] == "tracecontext", where


def test_deploy_dashboard_links_to_traces():
    dashboard = json.loads((DEPLOY / "grafana" / "openhub.json").read_text())
    links = [link for link in dashboard.get("links", []) if "trace" in link["title"].lower()]
    assert links and all(link["url"].startswith(("http", "/explore")) for link in links)


# --------------------------------------------------------------------------- Prometheus


def promtool(*args: str) -> subprocess.CompletedProcess:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool not found: run `make system-deps` (Debian package prometheus)")
    return subprocess.run([binary, *args], cwd=PROMETHEUS, capture_output=True, text=True, timeout=120)


def test_deploy_promtool_checks_the_alert_rules():
    result = promtool("check", "rules", "alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    names = {r["alert"] for g in yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"] for r in g["rules"]}
    assert names == {
        "OpenhubMessagesStuck",
        "OpenhubMessagesFailing",
        "OpenhubConfirmationsParked",
        "OpenhubNoWorkerOnline",
        "OpenhubIngress5xx",
        "OpenhubAuthFailures",
    }


def test_deploy_promtool_checks_the_scrape_config(tmp_path):
    # The token file the ingress job reads is the operator's (git-ignored): check a copy beside one.
    copy = tmp_path / "prometheus"
    shutil.copytree(PROMETHEUS, copy, ignore=shutil.ignore_patterns("openhub-metrics-token"))
    (copy / "openhub-metrics-token").write_text("m" * 40)
    result = promtool("check", "config", str(copy / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    (ingress,) = [
        job
        for job in yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())["scrape_configs"]
        if job["job_name"] == "openhub-ingress"
    ]
    assert ingress["authorization"] == {"type": "Bearer", "credentials_file": "openhub-metrics-token"}
    ignored = subprocess.run(["git", "check-ignore", "-q", "deploy/prometheus/openhub-metrics-token"], cwd=ROOT)
    assert ignored.returncode == 0, "the metrics token file must be git-ignored"


def test_deploy_promtool_unit_tests_the_alerts():
    result = promtool("test", "rules", "alerts.test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    tested = set(re.findall(r"alertname:\s*(\w+)", (PROMETHEUS / "alerts.test.yml").read_text()))
    assert len(tested) >= 2
    assert tested == {
        "OpenhubMessagesStuck",
        "OpenhubMessagesFailing",
        "OpenhubConfirmationsParked",
        "OpenhubNoWorkerOnline",
        "OpenhubIngress5xx",
        "OpenhubAuthFailures",
    }


def test_deploy_promtool_catches_a_broken_rule(tmp_path):
    rules = tmp_path / "broken.yml"
    rules.write_text("groups:\n- name: x\n  rules:\n  - alert: Broken\n    expr: sum(rate(openhub_messages[5m]) > \n")
    result = subprocess.run(
        [shutil.which("promtool") or "promtool", "check", "rules", str(rules)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0


# --------------------------------------------------------------------------- metric names

PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "atan2",
    "inf",
    "nan",
}
PROMETHEUS_BUILTIN = {"up"}  # synthesised by Prometheus for every target
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def metric_names_in(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (not functions, labels or keywords)."""
    text = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers, Grafana ${variables}
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range selectors
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w$.])([a-zA-Z_:][\w:]*)\b(\s*\()?", text):
        word, call = match.group(1), match.group(2)
        if call or word.lower() in PROMQL_WORDS or re.fullmatch(r"\d+\w*", word):
            continue
        names.add(word)
    return names


def promised_metrics() -> set[str]:
    lines = (DEPLOY / "metrics.txt").read_text().splitlines()
    names = {line.strip() for line in lines if line.strip() and not line.startswith("#")}
    assert "# flower" in lines, "metrics.txt lists Flower's metrics after a `# flower` line"
    return names


def unknown_metrics(exprs: list[str]) -> set[str]:
    promised = promised_metrics()
    unknown = set()
    for expr in exprs:
        for name in metric_names_in(expr):
            base = next((name[: -len(s)] for s in HISTOGRAM_SUFFIXES if name.endswith(s)), name)
            if name not in promised and base not in promised and name not in PROMETHEUS_BUILTIN:
                unknown.add(name)
    return unknown


def alert_exprs() -> list[str]:
    groups = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def dashboard_exprs() -> list[str]:
    dashboard = json.loads((DEPLOY / "grafana" / "openhub.json").read_text())
    exprs = []

    def walk(panels):
        for panel in panels:
            exprs.extend(t["expr"] for t in panel.get("targets", []))
            walk(panel.get("panels", []))

    walk(dashboard["panels"])
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict) and query.get("query", "").startswith("label_values("):
            exprs.append(query["query"].removeprefix("label_values(").split(",")[0])
    return exprs


def test_deploy_metric_name_extraction():
    expr = (
        "histogram_quantile(0.95, sum by (le, route) (rate(openhub_step_duration_seconds_bucket"
        '{route=~"$route", step!="x"}[$__rate_interval]))) / on(route) group_left max(up) > 2'
    )
    assert metric_names_in(expr) == {"openhub_step_duration_seconds_bucket", "up"}
    assert unknown_metrics([expr]) == set()
    assert unknown_metrics(["sum(rate(openhub_made_up_total[5m]))", "flower_typo > 0"]) == {
        "openhub_made_up_total",
        "flower_typo",
    }


def test_deploy_flower_exports_the_flower_metrics_listed():
    """The installed Flower registers every metric listed under `# flower` in metrics.txt."""
    lines = (DEPLOY / "metrics.txt").read_text().splitlines()
    listed = [n for n in lines[lines.index("# flower") + 1 :] if n.strip() and not n.startswith("#")]
    program = (
        "from flower.events import get_prometheus_metrics; get_prometheus_metrics(); "
        "from prometheus_client import generate_latest; print(generate_latest().decode())"
    )
    exposition = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    missing = [name for name in listed if f"# TYPE {name} " not in exposition]
    assert listed and not missing, f"Flower does not export {missing}"


# Read from the store by every ingress replica alike (openhub/api/metrics.py): summing them over
# replicas would multiply them by the number of replicas.
STORE_DERIVED = {
    "openhub_messages",
    "openhub_oldest_message_age_seconds",
    "openhub_confirmations",
    "openhub_messages_finished_total",
    "openhub_ext_call_failures_total",
    "openhub_step_duration_seconds",
}
AGGREGATION = re.compile(
    r"\b(sum|max|min|avg|count|group|stddev|stdvar|topk|bottomk|quantile|count_values)\s*"
    r"(?:(?:by|without)\s*\([^()]*\)\s*)?$"
)


def innermost_aggregation(expr: str, position: int) -> str | None:
    """The aggregation operator whose argument contains `expr[position]` most closely, if any."""
    text = re.sub(r'"(?:\\.|[^"\\])*"', lambda m: '"' + "_" * (len(m.group()) - 2) + '"', expr)
    depth = 0
    for i in range(position - 1, -1, -1):
        if text[i] == ")":
            depth += 1
        elif text[i] == "(":
            if depth:
                depth -= 1
                continue
            match = AGGREGATION.search(text[:i])
            if match:
                return match.group(1)
    return None


def replica_sums(exprs: list[str]) -> list[str]:
    """Expressions that aggregate a store-derived series with anything but max."""
    wrong = []
    for expr in exprs:
        for match in re.finditer(r"\b(openhub_\w+?)(?:_bucket|_count|_sum)?\b(?!\s*\()", expr):
            if match.group(1) in STORE_DERIVED and innermost_aggregation(expr, match.start()) != "max":
                wrong.append(f"{match.group(1)} in {expr}")
    return wrong


def test_deploy_store_derived_series_are_aggregated_with_max():
    assert innermost_aggregation('sum by (s) (max by (r, s) (rate(openhub_x{a=~"(b)"}[5m])))', 40) == "max"
    assert replica_sums(
        [
            "sum(rate(openhub_messages_finished_total[5m]))",
            "openhub_confirmations > 0",
            "max(openhub_confirmations) > 0",
            "sum(rate(openhub_http_requests_total[5m]))",
        ]
    ) == [
        "openhub_messages_finished_total in sum(rate(openhub_messages_finished_total[5m]))",
        "openhub_confirmations in openhub_confirmations > 0",
    ]
    assert replica_sums(alert_exprs()) == []
    panel_queries = [e for e in dashboard_exprs() if not re.fullmatch(r"\w+", e)]  # not label_values()
    assert replica_sums(panel_queries) == []


def test_deploy_alert_rules_use_only_exported_metrics():
    exprs = alert_exprs()
    assert len(exprs) == 6
    assert unknown_metrics(exprs) == set()


def test_deploy_dashboard_uses_only_exported_metrics():
    exprs = dashboard_exprs()
    assert len(exprs) >= 15
    assert unknown_metrics(exprs) == set()
    used = {name for e in exprs for name in metric_names_in(e)}
    bases = {next((n[: -len(s)] for s in HISTOGRAM_SUFFIXES if n.endswith(s)), n) for n in used}
    assert promised_metrics() <= bases | used, "a promised metric has no dashboard panel"


def test_deploy_dashboard_is_well_formed():
    dashboard = json.loads((DEPLOY / "grafana" / "openhub.json").read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}", panel["title"]


# --------------------------------------------------------------------------- systemd


def test_deploy_systemd_units_verify(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed on this machine")
    # Verify inside a scratch root that has the programs the units name, so a missing binary
    # (or a typo in its path) is an error but the real /opt/openhub need not exist here.
    unit_dir = tmp_path / "etc" / "systemd" / "system"
    unit_dir.mkdir(parents=True)
    programs = set()
    for unit in SYSTEMD.iterdir():
        shutil.copy(unit, unit_dir / unit.name)
        values = systemd_unit(unit.name) if unit.suffix == ".service" else {}
        for exec_start in values.get("Service.ExecStart", []) + values.get("Service.ExecStartPre", []):
            programs.add(shlex.split(exec_start)[0])
    for program in programs:
        fake = tmp_path / program.lstrip("/")
        fake.parent.mkdir(parents=True, exist_ok=True)
        fake.write_text("#!/bin/sh\n")
        fake.chmod(0o755)
    names = sorted(p.name.replace("@.service", "@1.service") for p in SYSTEMD.iterdir())
    result = subprocess.run(
        [analyze, "verify", f"--root={tmp_path}", "--man=no", "--recursive-errors=no", *names],
        cwd=unit_dir,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and not result.stderr.strip(), result.stdout + result.stderr


def test_deploy_systemd_worker_shutdown_and_instances():
    worker = systemd_unit("openhub-worker@.service")
    assert float(worker["Service.TimeoutStopSec"][0]) > step_timeout_seconds()
    assert worker["Service.KillMode"] == ["mixed"]
    # Several instances on one host need distinct Celery node names and heartbeat files.
    environment = " ".join(worker["Service.Environment"])
    assert "CELERY_WORKER_HOSTNAME=worker%i@%H" in environment
    assert "OPENHUB_WORKER_HEARTBEAT_FILE=/run/openhub-worker-%i/" in environment
    for unit in (
        "openhub-ingress.service",
        "openhub-worker@.service",
        "openhub-beat.service",
        "openhub-flower.service",
    ):
        values = systemd_unit(unit)
        assert values["Service.Restart"] == ["always"], unit
        assert values["Service.EnvironmentFile"] == ["/etc/openhub/openhub.env"], unit


def test_deploy_systemd_flower_listens_on_loopback():
    """Issue 27: Flower under systemd bound to 127.0.0.1, not all interfaces."""
    unit = (DEPLOY / "systemd" / "openhub-flower.service").read_text()
    assert "Environment=FLOWER_ADDRESS=127.0.0.1" in unit.splitlines()


def test_deploy_systemd_timers_start_procfile_commands():
    """Every timer starts a one-shot service that runs a Procfile command; prune is scheduled (issue 27)."""
    timers = sorted(p.name for p in SYSTEMD.glob("*.timer"))
    assert "openhub-exchanges-prune.timer" in timers
    known = {tuple(normalise_argv(shlex.split(c))) for c in read_procfile().values()}
    for timer in timers:
        service = (systemd_unit(timer).get("Timer.Unit") or [timer.replace(".timer", ".service")])[0]
        unit = systemd_unit(service)
        assert unit["Service.Type"] == ["oneshot"], service
        (exec_start,) = unit["Service.ExecStart"]
        assert tuple(normalise_argv(shlex.split(exec_start))) in known, exec_start
    assert k8s_resource("CronJob", "openhub-exchanges-prune")["spec"]["concurrencyPolicy"] == "Forbid"


def flower_login_checks() -> dict[str, list[str]]:
    """The command systemd runs before Flower and the one Kubernetes runs in Flower's init container."""
    (pre,) = systemd_unit("openhub-flower.service")["Service.ExecStartPre"]
    (init,) = pod_spec(k8s_resource("Deployment", "openhub-flower"))["initContainers"]
    services = compose()["services"]
    assert services["flower"]["depends_on"]["flower-login"]["condition"] == "service_completed_successfully"
    # $$: systemd's and compose's literal $
    return {
        "systemd": shlex.split(pre.replace("$$", "$")),
        "k8s": init["command"],
        "compose": [arg.replace("$$", "$") for arg in services["flower-login"]["command"]],
    }


@pytest.mark.parametrize(
    "value, starts",
    [
        (None, False),
        ("", False),
        ("admin:change-me-flower", False),
        ("admin", False),
        ("admin:", False),
        (":secret", False),
        ("ops:" + "s" * 32, True),
        ("ops:a:b,other:c", True),
    ],
)
def test_deploy_flower_refuses_a_missing_or_placeholder_login(value, starts):
    """Issue 27: nothing refused a missing or placeholder FLOWER_BASIC_AUTH (issue 34 L6: compose neither)."""
    placeholder = dict(
        line.split("=", 1)
        for line in (DEPLOY / ".env.example").read_text().splitlines()
        if line.startswith("FLOWER_BASIC_AUTH=")
    )["FLOWER_BASIC_AUTH"]
    assert placeholder == k8s_secret_example()["FLOWER_BASIC_AUTH"] == "admin:change-me-flower"
    env = {"PATH": "/usr/bin:/bin", **({} if value is None else {"FLOWER_BASIC_AUTH": value})}
    checks = flower_login_checks()
    assert checks["systemd"][1:] == checks["k8s"][1:] == checks["compose"][1:]
    for where, argv in checks.items():
        result = subprocess.run(["sh", *argv[1:]], env=env, capture_output=True, text=True, timeout=30)
        assert (result.returncode == 0) == starts, (where, value, result.stderr)
        assert starts or "refusing to start Flower: FLOWER_BASIC_AUTH" in result.stderr


def test_deploy_ingress_believes_its_proxies_forwarded_addresses():
    """Issue 34 H1: behind the Kubernetes Ingress controller every caller had the controller's address,
    so one caller's refused keys counted against everyone; deploy/ set no trusted proxies."""
    import ipaddress

    configured = {
        "k8s": k8s_resource("ConfigMap", "openhub-config")["data"]["OPENHUB_TRUSTED_PROXIES"],
        "compose": compose_env_defaults(compose()["services"]["ingress"]["environment"])["OPENHUB_TRUSTED_PROXIES"],
    }
    for where, value in configured.items():
        networks = [ipaddress.ip_network(part.strip()) for part in value.split(",")]
        assert networks and all(n.is_private and not n.is_loopback for n in networks), (where, value)
    assert "10.0.0.0/8" in configured["k8s"]  # the usual pod networks


def test_deploy_confirmations_have_workers_of_their_own():
    """Issue 34 M5: confirmations ran on the default queue (OPENHUB_CONFIRM_QUEUE was empty in deploy/), so
    slow receivers held the step workers; now every step worker leaves the confirm queue to the confirmer."""
    from openhub.core.config import Settings

    queue = Settings.from_env({}).confirm_queue
    assert queue == "openhub.confirm"
    assert k8s_resource("ConfigMap", "openhub-config")["data"]["OPENHUB_CONFIRM_QUEUE"] == queue
    assert compose_env_defaults(compose()["services"]["worker"]["environment"])["OPENHUB_CONFIRM_QUEUE"] == queue
    example = dict(
        line.split("=", 1)
        for line in (DEPLOY / ".env.example").read_text().splitlines()
        if line.startswith("OPENHUB_CONFIRM_QUEUE=")
    )
    assert example == {"OPENHUB_CONFIRM_QUEUE": queue}
    processes = {name: shlex.split(command) for name, command in read_procfile().items()}
    for name in ("worker", "worker-gevent"):
        argv = processes[name]
        assert argv[argv.index("--exclude-queues") + 1] == queue, name
    confirmer = processes["confirmer"]
    assert confirmer[confirmer.index("--queues") + 1] == queue


# --------------------------------------------------------------------------- the Spark cluster overlay

SPARK_OVERLAY = DEPLOY / "k8s-spark"


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_deploy_spark_overlay_manifests_match_the_schemas_offline(version, no_network):
    """deploy/k8s-spark: the standalone master, its workers and their network policy (issue 41)."""
    kustomization = yaml.safe_load((SPARK_OVERLAY / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"]) - {"../k8s"}
    patches = {p["path"] for p in kustomization["patches"]}
    assert listed | patches == {p.name for p in SPARK_OVERLAY.glob("*.yaml")} - {"kustomization.yaml"}
    docs = [doc for name in sorted(listed) for doc in load_yaml_documents(SPARK_OVERLAY / name)]
    assert {d["kind"] for d in docs} == {"Deployment", "Service", "NetworkPolicy"}
    errors = [e for e in (k8s_errors(d, version) for d in docs) if e]
    assert not errors, "\n".join(errors)
    for doc in docs:
        if doc["kind"] == "Deployment":
            container = pod_spec(doc)["containers"][0]
            assert container["image"] == "openhub-archive"  # the job's own Spark and JDBC driver
            assert container["command"][0] == "spark-class"
            assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
            assert {"cpu", "memory"} <= set(container["resources"]["limits"])


def test_deploy_spark_overlay_renders_with_its_base(tmp_path):
    """`kubectl apply -k deploy/k8s-spark` as README says: kustomize renders the overlay with the base (inside
    the base's folder, as deploy/k8s/spark, it refused with "cycle detected")."""
    for directory in (K8S, SPARK_OVERLAY):
        shutil.copytree(directory, tmp_path / directory.name, ignore=shutil.ignore_patterns("*secrets.env"))
    (tmp_path / "k8s" / "secrets.env").write_text((K8S / "secrets.env.example").read_text())
    rendered = kustomize(tmp_path / SPARK_OVERLAY.name)
    assert rendered.returncode == 0, rendered.stderr
    names = {(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(rendered.stdout) if d}
    assert ("Service", "openhub-spark-master") in names and len(names) > len(k8s_manifests())


def test_deploy_spark_overlay_points_the_archive_at_the_master():
    patch = load_yaml_documents(SPARK_OVERLAY / "archive-on-cluster.yaml")
    job = next(d for d in patch if d["kind"] == "CronJob")
    container = pod_spec(job)["containers"][0]
    assert normalise_argv(container["command"]) == normalise_argv(shlex.split(read_procfile()["archive"]))
    env = {e["name"]: e.get("value") for e in container["env"]}
    service = next(d for d in load_yaml_documents(SPARK_OVERLAY / "spark-master.yaml") if d["kind"] == "Service")
    assert env["OPENHUB_SPARK_MASTER"] == f"spark://{service['metadata']['name']}:7077"
    claim = next(d for d in patch if d["kind"] == "PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]  # executors on every node write the archive


# --------------------------------------------------------------------------- on RabbitMQ (issue 39 item 4)

RABBITMQ = DEPLOY / "rabbitmq"


def compose_rabbitmq() -> dict:
    return yaml.safe_load((DEPLOY / "compose.rabbitmq.yaml").read_text())


def compose_merged(base: dict, override: dict) -> dict:
    """`docker compose -f base -f override`: mappings merge key by key, anything else is replaced."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = compose_merged(merged[key], value)
        else:
            merged[key] = value
    return merged


def rabbitmq_conf() -> dict[str, str]:
    lines = (RABBITMQ / "rabbitmq.conf").read_text().splitlines()
    return dict(
        tuple(part.strip() for part in line.split("=", 1))
        for line in lines
        if line.strip() and not line.startswith("#")
    )


def test_deploy_compose_rabbitmq_override_matches_the_compose_specification():
    validator = jsonschema.Draft202012Validator(compose_schema())
    for model in (compose_rabbitmq(), compose_merged(compose(), compose_rabbitmq())):
        errors = [f"{e.json_path}: {e.message}" for e in validator.iter_errors(model)]
        assert not errors, "\n".join(errors)


def test_deploy_compose_rabbitmq_service_is_durable_healthy_and_keeps_its_login_off_the_command_line():
    rabbitmq = compose_rabbitmq()["services"]["rabbitmq"]
    assert re.fullmatch(r"rabbitmq:3\.(10|1[1-3])-management", rabbitmq["image"])
    assert "rabbitmq-data:/var/lib/rabbitmq" in rabbitmq["volumes"]
    assert "rabbitmq-data" in compose_rabbitmq()["volumes"]
    assert rabbitmq["healthcheck"]["test"] == ["CMD", "rabbitmq-diagnostics", "-q", "ping"]
    assert rabbitmq["hostname"], "the node name, and with it the data directory, must not change"
    assert "command" not in rabbitmq
    assert rabbitmq["environment"]["RABBITMQ_DEFAULT_PASS"].startswith("${RABBITMQ_PASSWORD:?")
    assert all(str(p).startswith("127.0.0.1:") for p in rabbitmq["ports"]), rabbitmq["ports"]
    mounts = {v.split(":")[0]: v.split(":")[1] for v in rabbitmq["volumes"]}
    assert mounts["./rabbitmq/rabbitmq.conf"].startswith("/etc/rabbitmq/conf.d/")
    assert mounts["./rabbitmq/enabled_plugins"] == "/etc/rabbitmq/enabled_plugins"
    for source in mounts:
        if source.startswith("./"):
            assert (DEPLOY / source).is_file(), source
    assert "rabbitmq_prometheus" in (RABBITMQ / "enabled_plugins").read_text()
    assert rabbitmq_conf()["prometheus.tcp.port"] == "15692"


def test_deploy_compose_on_rabbitmq_every_hub_service_uses_it():
    """No hub process stays on Redis as its broker; each waits for a healthy RabbitMQ, whose
    consumer_timeout is the one the workers check their steps against."""
    merged = compose_merged(compose(), compose_rabbitmq())["services"]
    hub_services = [
        name
        for name, service in compose()["services"].items()
        if "OPENHUB_BROKER_URL" in service.get("environment", {})
    ]
    assert {"migrate", "ingress", "worker", "confirmer", "beat", "flower"} <= set(hub_services)
    settings = hub_setting_names()
    consumer_timeout_ms = int(rabbitmq_conf()["consumer_timeout"])
    for name in hub_services:
        env = compose_env_defaults(merged[name]["environment"])
        assert env["OPENHUB_BROKER_URL"].startswith("amqp://openhub:${RABBITMQ_PASSWORD:?"), name
        assert env["OPENHUB_BROKER_URL"].endswith("@rabbitmq:5672/openhub"), name
        assert float(env["OPENHUB_CONSUMER_TIMEOUT"]) * 1000 == consumer_timeout_ms, name
        assert float(env["OPENHUB_CONSUMER_TIMEOUT"]) > float(env["OPENHUB_STEP_TIMEOUT"]), name
        assert env["OPENHUB_REDIS_URL"].startswith("redis://redis:"), "throttling needs its Redis"
        assert not {k for k in env if k.startswith("OPENHUB_")} - settings, name
        if name in ("ingress", "worker", "worker-gevent", "confirmer", "beat", "flower"):  # they use the broker
            assert merged[name]["depends_on"]["rabbitmq"]["condition"] == "service_healthy", name
    assert compose_rabbitmq()["services"]["rabbitmq"]["environment"]["RABBITMQ_DEFAULT_VHOST"] == "openhub"
    interpolated = set(re.findall(r"\$\{?([A-Z][A-Z0-9_]*)", (DEPLOY / "compose.rabbitmq.yaml").read_text()))
    assert not interpolated - env_example_names(), "compose.rabbitmq.yaml variables missing from .env.example"


RABBITMQ_OVERLAY = DEPLOY / "k8s-rabbitmq"


def rabbitmq_cluster() -> dict:
    (cluster,) = load_yaml_documents(RABBITMQ_OVERLAY / "rabbitmq-cluster.yaml")
    return cluster


def rabbitmq_overlay_rendered(tmp_path: Path, with_secrets: bool = True) -> subprocess.CompletedProcess:
    """`kubectl kustomize deploy/k8s-rabbitmq` on a copy, with secret files made from the examples
    (the overlay's own only `with_secrets`)."""
    for directory in (K8S, RABBITMQ_OVERLAY):
        shutil.copytree(directory, tmp_path / directory.name, ignore=shutil.ignore_patterns("*secrets.env"))
    (tmp_path / "k8s" / "secrets.env").write_text((K8S / "secrets.env.example").read_text())
    if with_secrets:
        (tmp_path / RABBITMQ_OVERLAY.name / "rabbitmq-secrets.env").write_text(
            (RABBITMQ_OVERLAY / "rabbitmq-secrets.env.example").read_text()
        )
    return kustomize(tmp_path / RABBITMQ_OVERLAY.name)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_deploy_rabbitmq_overlay_renders_and_matches_the_schemas_offline(version, tmp_path, no_network):
    """deploy/k8s-rabbitmq: the whole hub, rendered by kustomize, validates strictly offline. (The
    RabbitmqCluster is not part of it: its CRD is the operator's; test_deploy_rabbitmq_cluster_… checks it.)"""
    rendered = rabbitmq_overlay_rendered(tmp_path)
    assert rendered.returncode == 0, rendered.stderr
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    assert len(docs) >= len(k8s_manifests()) + 1  # the base and the generated Secret
    errors = [e for e in (k8s_errors(d, version) for d in docs) if e]
    assert not errors, "\n".join(errors)


def test_deploy_rabbitmq_overlay_takes_the_broker_url_from_the_secret(tmp_path):
    missing = rabbitmq_overlay_rendered(tmp_path / "missing", with_secrets=False)
    assert missing.returncode != 0 and "rabbitmq-secrets.env" in missing.stderr  # no broker URL, no apply
    rendered = rabbitmq_overlay_rendered(tmp_path / "ok")
    assert rendered.returncode == 0, rendered.stderr
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    (config,) = [d["data"] for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "openhub-config"]
    (secret,) = [d for d in docs if d["kind"] == "Secret"]
    values = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert "OPENHUB_BROKER_URL" not in config, "the URL holds the password: Secret only"
    url = urllib.parse.urlsplit(values["OPENHUB_BROKER_URL"])
    assert url.scheme == "amqp" and url.port == 5672
    assert url.hostname == rabbitmq_cluster()["metadata"]["name"], "the operator's Service has the cluster's name"
    assert set(k8s_secret_example()) <= set(values), "the base's secrets are kept"
    assert float(config["OPENHUB_CONSUMER_TIMEOUT"]) > float(config["OPENHUB_STEP_TIMEOUT"])
    assert config["OPENHUB_REDIS_URL"].startswith("redis://"), "throttling keeps its Redis"
    assert set(config) <= hub_setting_names() | tracing_variable_names()
    refs = {
        s["secretRef"]["name"]
        for d in docs
        if d["kind"] in ("Deployment", "Job", "CronJob")
        for c in pod_spec(d)["containers"]
        for s in c.get("envFrom", [])
        if "secretRef" in s
    }
    assert refs == {secret["metadata"]["name"]}
    ignored = subprocess.run(["git", "check-ignore", "-q", "deploy/k8s-rabbitmq/rabbitmq-secrets.env"], cwd=ROOT)
    assert ignored.returncode == 0, "rabbitmq-secrets.env holds the broker's password: it must be git-ignored"


def test_deploy_rabbitmq_cluster_is_the_operators_and_agrees_with_the_hub():
    """The RabbitmqCluster cannot be validated offline (its schema is the operator's CRD), so it stays out
    of the kustomization, applied on its own, and its settings are checked here against the hub's."""
    kustomization = yaml.safe_load((RABBITMQ_OVERLAY / "kustomization.yaml").read_text())
    assert "rabbitmq-cluster.yaml" not in kustomization["resources"]
    cluster = rabbitmq_cluster()
    assert (cluster["apiVersion"], cluster["kind"]) == ("rabbitmq.com/v1beta1", "RabbitmqCluster")
    assert cluster["metadata"]["namespace"] == yaml.safe_load((K8S / "kustomization.yaml").read_text())["namespace"]
    spec = cluster["spec"]
    assert spec["replicas"] == 1, "classic queues are not replicated: more nodes only split them"
    assert spec["persistence"]["storage"]
    assert {"cpu", "memory"} <= set(spec["resources"]["limits"])
    assert "rabbitmq_prometheus" in spec["rabbitmq"]["additionalPlugins"]
    conf = dict(
        tuple(p.strip() for p in line.split("=", 1))
        for line in spec["rabbitmq"]["additionalConfig"].splitlines()
        if line.strip()
    )
    patch = yaml.safe_load((RABBITMQ_OVERLAY / "broker-on-rabbitmq.yaml").read_text())
    hub = {op["path"].rsplit("/", 1)[1]: op.get("value") for op in patch}
    assert int(conf["consumer_timeout"]) == float(hub["OPENHUB_CONSUMER_TIMEOUT"]) * 1000
    assert conf["consumer_timeout"] == rabbitmq_conf()["consumer_timeout"], "compose and Kubernetes agree"


# RabbitMQ's own series the RabbitMQ alerts may read (rabbitmq_prometheus, /metrics/per-object); not in
# metrics.txt, which lists what the hub and Flower export.
RABBITMQ_METRICS = {"rabbitmq_queue_messages_ready", "rabbitmq_queue_messages_unacked"}
RABBITMQ_ALERTS = {"RabbitmqQueueBacklog", "RabbitmqUnackedMessages"}


def test_deploy_promtool_checks_and_unit_tests_the_rabbitmq_alerts():
    result = promtool("check", "rules", "rabbitmq-alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    groups = yaml.safe_load((PROMETHEUS / "rabbitmq-alerts.yml").read_text())["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert {rule["alert"] for rule in rules} == RABBITMQ_ALERTS
    read = set().union(*(metric_names_in(rule["expr"]) for rule in rules))
    assert read == RABBITMQ_METRICS, read
    for rule in rules:  # a queue lives on one node: per queue, whichever node reports it
        assert rule["expr"].startswith("sum by (vhost, queue) ("), rule["expr"]
    result = promtool("test", "rules", "rabbitmq-alerts.test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    tested = set(re.findall(r"alertname:\s*(\w+)", (PROMETHEUS / "rabbitmq-alerts.test.yml").read_text()))
    assert tested == RABBITMQ_ALERTS


def test_deploy_prometheus_scrapes_rabbitmq_per_queue_beside_the_hub():
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    assert "rabbitmq-alerts.yml" in config["rule_files"]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert {"openhub-ingress", "openhub-flower", "rabbitmq"} <= set(jobs)
    rabbitmq = jobs["rabbitmq"]
    assert rabbitmq["metrics_path"] == "/metrics/per-object"  # the alerts need the queue label
    (target,) = rabbitmq["static_configs"][0]["targets"]
    host, port = target.split(":")
    assert host in compose_rabbitmq()["services"] and port == rabbitmq_conf()["prometheus.tcp.port"]


RABBITMQ_DROP_IN = RABBITMQ / "systemd" / "openhub-.service.d" / "rabbitmq.conf"


def test_deploy_systemd_rabbitmq_drop_in_reads_the_broker_after_the_units_settings():
    lines = [
        line.strip() for line in RABBITMQ_DROP_IN.read_text().splitlines() if line.strip() and not line.startswith("#")
    ]
    assert "EnvironmentFile=/etc/openhub/rabbitmq.env" in lines
    for unit in sorted(SYSTEMD.glob("*.service")):  # the drop-in's file is read after each unit's own
        assert systemd_unit(unit.name).get("Service.EnvironmentFile", []) in ([], ["/etc/openhub/openhub.env"]), unit
    example = dict(
        line.split("=", 1)
        for line in (RABBITMQ / "systemd" / "rabbitmq.env.example").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )
    assert set(example) <= hub_setting_names()
    assert urllib.parse.urlsplit(example["OPENHUB_BROKER_URL"]).scheme == "amqp"
    assert float(example["OPENHUB_CONSUMER_TIMEOUT"]) * 1000 == int(rabbitmq_conf()["consumer_timeout"])
    assert float(example["OPENHUB_CONSUMER_TIMEOUT"]) > step_timeout_seconds()


def test_deploy_systemd_rabbitmq_drop_in_verifies(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed on this machine")
    unit_dir = tmp_path / "etc" / "systemd" / "system"
    (unit_dir / RABBITMQ_DROP_IN.parent.name).mkdir(parents=True)
    shutil.copy(RABBITMQ_DROP_IN, unit_dir / RABBITMQ_DROP_IN.parent.name / RABBITMQ_DROP_IN.name)
    units = ["openhub-worker@.service", "openhub-ingress.service", "openhub-migrate.service"]
    for name in units:
        shutil.copy(SYSTEMD / name, unit_dir / name)
        values = systemd_unit(name)
        for exec_start in values.get("Service.ExecStart", []) + values.get("Service.ExecStartPre", []):
            fake = tmp_path / shlex.split(exec_start)[0].lstrip("/")
            fake.parent.mkdir(parents=True, exist_ok=True)
            fake.write_text("#!/bin/sh\n")
            fake.chmod(0o755)
    names = [name.replace("@.service", "@1.service") for name in units]
    result = subprocess.run(
        [analyze, "verify", f"--root={tmp_path}", "--man=no", "--recursive-errors=no", *names],
        cwd=unit_dir,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and not result.stderr.strip(), result.stdout + result.stderr
