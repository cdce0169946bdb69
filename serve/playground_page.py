"""GET /: the playground, a page to try the served model in a browser (serve/playground/index.html, its scripts
and style in serve/playground/assets/, served under /playground/).

Its files ship in this package and are served as they are: no build step, and nothing loaded from another host,
since the machines that run the server may be offline.  The page talks to the server through its public
endpoints only: /health and /openapi.json for the model and the fields' limits, POST /generate streamed with
`logprobs` for the tokens, their probabilities and the reply's latency, /metrics for the live panel.  Its
Content-Security-Policy lets it load and fetch from this server alone.
"""
from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

PAGE_PATH = "/"
ASSETS_PATH = "/playground"
PAGE_FILE = "index.html"
# Styles set from a script (element.style) are not inline styles to a CSP; the page has none of its own.
CONTENT_SECURITY_POLICY = ("default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
                           "form-action 'none'; frame-ancestors 'none'")


def page_folder() -> Path:
    return Path(str(files("serve") / "playground"))


def assets_folder() -> Path:
    return page_folder() / "assets"


def asset_paths() -> set[str]:
    """The URL of every file the page may load."""
    return {f"{ASSETS_PATH}/{path.name}" for path in assets_folder().iterdir() if path.is_file()}


def install_playground(app: FastAPI) -> set[str]:
    """Serve the page at / and its files under /playground/; returns their paths, for the request log."""
    page = page_folder() / PAGE_FILE

    async def playground() -> FileResponse:
        return FileResponse(page, media_type="text/html; charset=utf-8",
                            headers={"Content-Security-Policy": CONTENT_SECURITY_POLICY})

    app.mount(ASSETS_PATH, StaticFiles(directory=assets_folder()), name="playground")
    app.add_api_route(PAGE_PATH, playground, methods=["GET"], response_class=FileResponse,
                      summary="The playground: a page to try the model in a browser",
                      responses={200: {"description": "the page (HTML); its scripts and styles come from "
                                                      f"{ASSETS_PATH}/", "content": {"text/html": {}}}})
    return asset_paths() | {PAGE_PATH}
