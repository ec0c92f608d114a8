"""docker/*.Dockerfile: no Docker engine runs here, so check what can be checked statically.

Image names and tags agree with `helm template` defaults, the base image is pinned, the final
stage runs as a numeric non-root user, health checks and entrypoints match the chart, and the
per-image requirement pins cover every third-party module the image's code imports.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import sys
import tomllib
from dataclasses import dataclass, field
from importlib.metadata import (
    PackageNotFoundError,
    distribution,
    packages_distributions,
    version,
)
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from support.tools import REPO_ROOT, single_object

DOCKER_DIR = REPO_ROOT / "docker"
PACKAGE_DIR = REPO_ROOT / "src" / "durable_producer"
# A base image is pinned when it names a full patch release or a digest, never a moving tag.
PINNED_PYTHON_IMAGE = re.compile(r"^python:3\.11\.\d+-slim(-[a-z]+)?(@sha256:[0-9a-f]{64})?$")


@dataclass
class Instruction:
    keyword: str
    arguments: str


@dataclass
class Dockerfile:
    global_args: dict[str, str] = field(default_factory=dict)
    stages: list[list[Instruction]] = field(default_factory=list)

    @property
    def final_stage(self) -> list[Instruction]:
        return self.stages[-1]

    def final(self, keyword: str) -> list[str]:
        return [i.arguments for i in self.final_stage if i.keyword == keyword]

    def exec_form(self, keyword: str) -> list[str]:
        (arguments,) = self.final(keyword)
        parsed = json.loads(arguments)
        assert isinstance(parsed, list), f"{keyword} must use the exec (JSON) form"
        return parsed

    def labels(self) -> dict[str, str]:
        return {
            key: value
            for arguments in self.final("LABEL")
            for key, _, value in (token.partition("=") for token in shlex.split(arguments))
        }

    def stage_args(self) -> dict[str, str]:
        return dict(
            arguments.split("=", 1) for arguments in self.final("ARG") if "=" in arguments
        )


def parse_dockerfile(path: Path) -> Dockerfile:
    logical_lines: list[str] = []
    pending = ""
    for raw_line in path.read_text().splitlines():
        line = raw_line.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical_lines.append(pending + line)
        pending = ""
    dockerfile = Dockerfile()
    for line in logical_lines:
        keyword, _, arguments = line.partition(" ")
        instruction = Instruction(keyword.upper(), arguments.strip())
        if instruction.keyword == "FROM":
            dockerfile.stages.append([instruction])
        elif not dockerfile.stages and instruction.keyword == "ARG":
            name, _, default = instruction.arguments.partition("=")
            dockerfile.global_args[name] = default
        else:
            dockerfile.stages[-1].append(instruction)
    return dockerfile


def resolve(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], text)


def base_images(dockerfile: Dockerfile) -> list[str]:
    stage_names = set()
    images = []
    for stage in dockerfile.stages:
        image, *alias = resolve(stage[0].arguments, dockerfile.global_args).split()
        if image not in stage_names:
            images.append(image)
        if alias:
            stage_names.add(alias[-1])
    return images


def chart_images(objects: list[dict[str, Any]]) -> dict[str, str]:
    (container,) = single_object(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    return {"operator": container["image"], "agent": env["DURABLE_PRODUCER_AGENT_IMAGE"]}


COMPONENTS = ("operator", "agent")


def dockerfile_for(component: str) -> Dockerfile:
    return parse_dockerfile(DOCKER_DIR / f"{component}.Dockerfile")


@pytest.mark.parametrize("component", COMPONENTS)
def test_image_name_and_tag_agree_with_helm_template_defaults(
    component: str, default_objects: list[dict[str, Any]]
) -> None:
    dockerfile = dockerfile_for(component)
    labels = dockerfile.labels()
    image_version = resolve(labels["org.opencontainers.image.version"], dockerfile.stage_args())
    built_image = f"{labels['org.opencontainers.image.title']}:{image_version}"

    assert built_image == chart_images(default_objects)[component]
    assert image_version == version("durable-producer")
    build_command = f"-f docker/{component}.Dockerfile -t {built_image} ."
    assert build_command in (DOCKER_DIR / f"{component}.Dockerfile").read_text()
    assert build_command in (REPO_ROOT / "docs" / "install.md").read_text()


@pytest.mark.parametrize("component", COMPONENTS)
def test_base_image_is_a_pinned_slim_python_311(component: str) -> None:
    images = base_images(dockerfile_for(component))

    assert images, "no FROM instruction"
    for image in images:
        assert PINNED_PYTHON_IMAGE.match(image), f"base image {image!r} is not pinned"


@pytest.mark.parametrize("component", COMPONENTS)
def test_final_stage_runs_as_a_numeric_non_root_user(
    component: str, default_objects: list[dict[str, Any]]
) -> None:
    users = dockerfile_for(component).final("USER")

    assert users, "the final stage has no USER instruction: it would run as root"
    user, _, group = users[-1].partition(":")
    assert user.isdigit() and int(user) > 0, "USER must be numeric for runAsNonRoot checks"
    assert not group or (group.isdigit() and int(group) > 0)
    pod_security = single_object(default_objects, "Deployment")["spec"]["template"]["spec"][
        "securityContext"]
    assert int(user) == pod_security["runAsUser"]


def test_operator_entrypoint_is_the_chart_command(default_objects: list[dict[str, Any]]) -> None:
    dockerfile = dockerfile_for("operator")
    (container,) = single_object(default_objects, "Deployment")["spec"]["template"]["spec"][
        "containers"]

    image_command = dockerfile.exec_form("ENTRYPOINT") + dockerfile.exec_form("CMD")

    # The image alone runs one operator (--standalone); the chart runs replicas that share
    # the handlers through kopf peering, so it swaps that one flag.
    assert [
        "--peering=dp-durable-producer" if arg == "--standalone" else arg for arg in image_command
    ] == container["command"]


def test_agent_entrypoint_runs_the_agent_on_its_data_dir() -> None:
    dockerfile = dockerfile_for("agent")

    assert dockerfile.exec_form("ENTRYPOINT") == ["durable-agent"]
    assert dockerfile.exec_form("CMD") == ["run", "--data-dir", "/var/lib/durable-producer"]
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "durable-agent" in scripts


@pytest.mark.parametrize(("component", "health_url"), [
    ("operator", "http://127.0.0.1:8080/healthz"),
    ("agent", "http://127.0.0.1:9644/healthz"),
])
def test_healthcheck_probes_the_health_endpoint(component: str, health_url: str) -> None:
    (healthcheck,) = dockerfile_for(component).final("HEALTHCHECK")
    options, _, command = healthcheck.partition(" CMD ")

    assert "--interval=" in options and "--timeout=" in options
    assert health_url in json.loads(command)[-1]


def test_agent_image_exposes_the_metrics_port_the_operator_configures() -> None:
    from durable_producer.operator.model import model

    metrics_port = model.AgentPorts().metrics
    (healthcheck,) = dockerfile_for("agent").final("HEALTHCHECK")

    assert dockerfile_for("agent").final("EXPOSE") == [str(metrics_port)]
    assert f"http://127.0.0.1:{metrics_port}/healthz" in healthcheck


# --- requirement pins ----------------------------------------------------------------------


def requirement_pins(component: str) -> dict[str, Requirement]:
    lines = (DOCKER_DIR / f"{component}-requirements.txt").read_text().splitlines()
    requirements = [Requirement(line) for line in lines if line and not line.startswith("#")]
    return {canonicalize_name(req.name): req for req in requirements}


def project_dependencies() -> dict[str, Requirement]:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    return {
        canonicalize_name(req.name): req
        for req in map(Requirement, project["dependencies"])
    }


def module_file(module: str) -> Path | None:
    relative = Path(*module.split("."))
    for candidate in (REPO_ROOT / "src" / relative / "__init__.py",
                      (REPO_ROOT / "src" / relative).with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def optional_import_nodes(tree: ast.AST) -> set[int]:
    """ids of import statements inside ``try: ... except ImportError:`` (optional extras)."""
    optional: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Try):
            continue
        caught = {
            name.id
            for handler in node.handlers if handler.type is not None
            for name in ast.walk(handler.type) if isinstance(name, ast.Name)
        }
        if caught & {"ImportError", "ModuleNotFoundError"}:
            optional.update(id(child) for statement in node.body for child in ast.walk(statement))
    return optional


def imported_modules(path: Path, module: str) -> dict[str, bool]:
    """Absolute names of everything ``path`` imports (at any depth) -> whether optional."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    optional = optional_import_nodes(tree)
    names: dict[str, bool] = {}

    def add(name: str, node: ast.AST) -> None:
        names[name] = names.get(name, True) and id(node) in optional

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                prefix = f"{base}.{node.module}" if node.module else base
            else:
                prefix = node.module or ""
            add(prefix, node)
            for alias in node.names:
                add(f"{prefix}.{alias.name}", node)
    return names


def third_party_imports(root_package: str, *, include_optional: bool) -> dict[str, set[str]]:
    """Top-level third-party modules imported by ``root_package`` and what it pulls in.

    Follows imports of other durable_producer modules transitively. Returns module ->
    the project files that import it. Optional imports (guarded by ``except ImportError``)
    count only with ``include_optional``.
    """
    root_dir = REPO_ROOT / "src" / Path(*root_package.split("."))
    queue = [
        ".".join(path.relative_to(REPO_ROOT / "src").with_suffix("").parts).removesuffix(
            ".__init__")
        for path in sorted(root_dir.rglob("*.py"))
    ]
    seen: set[str] = set()
    found: dict[str, set[str]] = {}
    while queue:
        module = queue.pop()
        if module in seen:
            continue
        seen.add(module)
        path = module_file(module)
        if path is None:
            continue
        for name, optional in imported_modules(path, module).items():
            top = name.split(".")[0]
            if top == "durable_producer":
                # importing a.b.c runs the __init__ of a and a.b as well
                parts = name.split(".")
                queue.extend(".".join(parts[:depth]) for depth in range(1, len(parts) + 1))
            elif top not in sys.stdlib_module_names and top != "__future__" and (
                include_optional or not optional
            ):
                found.setdefault(top, set()).add(str(path.relative_to(REPO_ROOT)))
    return found


def installed_closure(names: set[str]) -> set[str]:
    """``names`` plus everything they require, per the installed packages' metadata."""
    closure: set[str] = set()
    queue = list(names)
    while queue:
        name = queue.pop()
        if name in closure:
            continue
        closure.add(name)
        try:
            requirements = distribution(name).requires or []
        except PackageNotFoundError:
            continue
        for line in requirements:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                queue.append(canonicalize_name(requirement.name))
    return closure


@pytest.mark.parametrize(("component", "package"), [
    ("operator", "durable_producer.operator"),
    ("agent", "durable_producer.buffer_agent"),
])
def test_image_requirements_cover_every_third_party_import(component: str, package: str) -> None:
    installed = installed_closure(set(requirement_pins(component)))
    distributions = packages_distributions()
    missing = {}
    for module, importers in third_party_imports(package, include_optional=False).items():
        names = {canonicalize_name(d) for d in distributions.get(module, [module])}
        if not names & installed:
            missing[module] = sorted(importers)

    assert not missing, f"docker/{component}-requirements.txt lacks the packages of {missing}"


@pytest.mark.parametrize(("component", "package"), [
    ("operator", "durable_producer.operator"),
    ("agent", "durable_producer.buffer_agent"),
])
def test_image_requirements_pin_nothing_the_image_does_not_import(
    component: str, package: str
) -> None:
    distributions = packages_distributions()
    imported = {
        canonicalize_name(name)
        for module in third_party_imports(package, include_optional=True)
        for name in distributions.get(module, [module])
    }
    unused = set(requirement_pins(component)) - imported

    assert not unused, f"docker/{component}-requirements.txt pins unused packages {unused}"


@pytest.mark.parametrize("component", COMPONENTS)
def test_image_requirements_are_exact_pins_allowed_by_pyproject(component: str) -> None:
    dependencies = project_dependencies()
    for name, requirement in requirement_pins(component).items():
        (specifier,) = requirement.specifier
        assert specifier.operator == "==", f"{requirement} is not pinned exactly"
        assert name in dependencies, f"{name} is not a dependency in pyproject.toml"
        assert dependencies[name].specifier.contains(specifier.version), (
            f"{requirement} does not satisfy pyproject.toml's {dependencies[name]}"
        )
        assert name not in {"pyspark", "pyarrow"}, "Spark belongs in Spark images, not ours"


@pytest.mark.parametrize("component", COMPONENTS)
def test_dockerfile_installs_its_requirements_and_the_project_without_dependencies(
    component: str,
) -> None:
    build_stage = " ".join(i.arguments for i in dockerfile_for(component).stages[0])

    assert f"docker/{component}-requirements.txt" in build_stage
    assert "pip install --no-deps /src" in build_stage


def test_agent_image_command_is_accepted_by_the_agent_cli() -> None:
    """The image's CMD plus the Kafka address (which only the injecting operator knows, as
    DURABLE_AGENT_KAFKA_BOOTSTRAP) is a complete `durable-agent run` command line."""
    from durable_producer.buffer_agent import cli

    parser = cli.build_parser({"DURABLE_AGENT_KAFKA_BOOTSTRAP": "kafka.example:9092"})
    arguments = parser.parse_args(dockerfile_for("agent").exec_form("CMD"))
    (healthcheck,) = dockerfile_for("agent").final("HEALTHCHECK")

    assert arguments.command == "run"
    assert str(arguments.data_dir) == "/var/lib/durable-producer"
    assert arguments.listen == ("127.0.0.1", 9092)
    assert f"http://127.0.0.1:{arguments.metrics_listen[1]}/healthz" in healthcheck
    assert dockerfile_for("agent").final("VOLUME") == ['["/var/lib/durable-producer"]']


@pytest.mark.parametrize("component", COMPONENTS)
def test_build_context_ignore_file_lets_through_exactly_what_is_copied(component: str) -> None:
    ignore = DOCKER_DIR / f"{component}.Dockerfile.dockerignore"
    patterns = [line for line in ignore.read_text().splitlines()
                if line and not line.startswith("#")]
    allowed = {pattern[1:].rstrip("/") for pattern in patterns if pattern.startswith("!")}
    copied = {
        source.rstrip("/")
        for arguments in (i.arguments for stage in dockerfile_for(component).stages
                          for i in stage if i.keyword == "COPY")
        if not arguments.startswith("--from")
        for source in arguments.split()[:-1]
    }

    assert patterns[0] == "*"
    assert copied == allowed
