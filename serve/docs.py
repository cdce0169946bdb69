"""/docs (Swagger UI) and /redoc (ReDoc), each page's script, stylesheet and icon served from this server.

FastAPI's own pages load them from a CDN and are blank on a machine without internet; the files here come from
the installed fastapi-offline package, which ships them (and nothing else this server uses).
"""
from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

DOCS_PATH = "/docs"
REDOC_PATH = "/redoc"
ASSETS_PATH = "/docs-assets"
SWAGGER_JS, SWAGGER_CSS, REDOC_JS, FAVICON = ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js",
                                              "favicon.png")


def assets_folder() -> str:
    return str(files("fastapi_offline") / "static")


def asset_url(name: str) -> str:
    return f"{ASSETS_PATH}/{name}"


def install_docs(app: FastAPI) -> set[str]:
    """Serve the two pages and their files on `app` (made with docs_url=None, redoc_url=None); returns the
    paths of the pages, for the request log."""
    title = f"{app.title} - API"

    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=app.openapi_url, title=title, swagger_js_url=asset_url(SWAGGER_JS),
                                   swagger_css_url=asset_url(SWAGGER_CSS), swagger_favicon_url=asset_url(FAVICON))

    async def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url=app.openapi_url, title=title, redoc_js_url=asset_url(REDOC_JS),
                              redoc_favicon_url=asset_url(FAVICON), with_google_fonts=False)

    app.mount(ASSETS_PATH, StaticFiles(directory=assets_folder()), name="docs-assets")
    app.add_api_route(DOCS_PATH, swagger_ui, methods=["GET"], include_in_schema=False)
    app.add_api_route(REDOC_PATH, redoc, methods=["GET"], include_in_schema=False)
    return {DOCS_PATH, REDOC_PATH}
