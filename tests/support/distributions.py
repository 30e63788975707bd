"""Installed distributions and their requirement closures, for the tests that install a wheel offline."""

from __future__ import annotations

import importlib.metadata as md
import re
from pathlib import Path


def requirement_names(dist: md.Distribution) -> list[str]:
    """The names of a distribution's unconditional requirements."""
    names = []
    for requirement in dist.requires or []:
        if ";" in requirement and "extra" in requirement.split(";", 1)[1]:
            continue
        names.append(re.split(r"[\s\[<>=!~;(]", requirement, maxsplit=1)[0])
    return names


def closure(names: list[str]) -> list[md.Distribution]:
    """The installed distributions these names need, theirs included."""
    seen: dict[str, md.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue  # a requirement for another platform or Python version
        seen[name] = dist
        todo.extend(requirement_names(dist))
    return list(seen.values())


def link_top_levels(dists: list[md.Distribution], into: Path) -> None:
    for dist in dists:
        for file in dist.files or []:
            top = file.parts[0]
            if top.endswith((".dist-info", ".pth")) or top == ".." or top == "__pycache__":
                continue
            source = Path(str(dist.locate_file(top)))
            target = into / top
            if source.exists() and not target.exists():
                target.symlink_to(source)
        dist_info = (
            Path(str(dist.locate_file("")))
            / f"{dist.metadata['Name'].replace('-', '_')}-{dist.version}.dist-info"
        )
        if dist_info.exists() and not (into / dist_info.name).exists():
            (into / dist_info.name).symlink_to(dist_info)
