"""Error responses shaped as the real servers shape them."""

from __future__ import annotations

from aiohttp import web


def openai_error(status: int, message: str, kind: str, param: str | None = None) -> web.Response:
    """vLLM's OpenAI-style error: ``{"error": {"message", "type", "param", "code"}}``."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return web.json_response(body, status=status)


def internal_error() -> web.Response:
    """An unhandled server exception as FastAPI answers it: 500, plain text."""
    return web.Response(status=500, text="Internal Server Error")


def detail(status: int, text: str) -> web.Response:
    """FastAPI's own routing errors: ``{"detail": "Not Found"}`` and the like."""
    return web.json_response({"detail": text}, status=status)
