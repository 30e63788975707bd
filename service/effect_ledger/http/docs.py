"""The interactive API docs at /schema, with Swagger UI's assets served from an installed package.

The page loads nothing from another host, so it works without internet: the JavaScript and CSS are the
swagger-ui dist files that the PyPI package swagger-ui-py ships (its Python code is never imported),
served under /schema/assets.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from litestar.openapi.plugins import SwaggerRenderPlugin
from litestar.router import Router
from litestar.static_files import create_static_files_router

ASSETS = "/schema/assets"
# An inline icon, so that the browser asks no host for one.
FAVICON = "<link rel='icon' href='data:,'>"


def swagger_ui_dir() -> Path:
    """The installed swagger-ui dist files (package swagger-ui-py), located without importing it."""
    spec = importlib.util.find_spec("swagger_ui")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the swagger-ui-py package is not installed (a dependency of effect-ledger)")
    return Path(next(iter(spec.submodule_search_locations))) / "static"


def docs_plugin() -> SwaggerRenderPlugin:
    """Swagger UI pointed at the local assets."""
    return SwaggerRenderPlugin(
        js_url=f"{ASSETS}/swagger-ui-bundle.js",
        css_url=f"{ASSETS}/swagger-ui.css",
        standalone_preset_js_url=f"{ASSETS}/swagger-ui-standalone-preset.js",
        favicon=FAVICON,
    )


def docs_assets() -> Router:
    """The route serving the assets (not part of the API, so not in the OpenAPI document)."""
    return create_static_files_router(
        path=ASSETS, directories=[swagger_ui_dir()], include_in_schema=False, name="docs_assets"
    )
