"""The interactive docs at /schema load everything from the service itself: they work without internet."""

from __future__ import annotations

import re

from support.server import Service


async def test_the_docs_page_references_no_other_host_and_its_assets_are_served(service: Service) -> None:
    async with service.client() as http:
        page = await http.get("/schema")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        html = page.text
        references = re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)["']""", html)
        assert len(references) >= 4  # icon, stylesheet, two scripts
        assert [
            r for r in references if not (r.startswith("/") and not r.startswith("//")) and r != "data:,"
        ] == []
        assert not re.search(r"cdn\.|jsdelivr|unpkg|googleapis|//[a-z0-9.-]+\.(?:com|net|org|io)/", html)
        for asset in ("swagger-ui-bundle.js", "swagger-ui-standalone-preset.js", "swagger-ui.css"):
            assert f"/schema/assets/{asset}" in references
            got = await http.get(f"/schema/assets/{asset}")
            assert got.status_code == 200 and len(got.content) > 10_000, asset
            kind = "text/css" if asset.endswith(".css") else "javascript"
            assert kind in got.headers["content-type"], got.headers["content-type"]


async def test_the_assets_are_not_part_of_the_api_document(service: Service) -> None:
    async with service.client() as http:
        document = (await http.get("/schema/openapi.json")).json()
    assert not [path for path in document["paths"] if path.startswith("/schema")]
