"""`infer_model`: a model string such as `"openai:gpt-4.1-mini"` to a `Model`."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from handrail.errors import ConfigError
from handrail.models._model import Model

__all__ = ["KNOWN_PREFIXES", "infer_model"]


def _openai(name: str) -> Model:
    from handrail.models._openai import OpenAIChat

    return OpenAIChat(name)


def _openrouter(name: str) -> Model:
    from handrail.models._openai import OpenAIChat

    return OpenAIChat(
        name,
        base_url=os.environ.get("OPENROUTER_BASE_URL") or "https://openrouter.ai/api/v1",
        api_key_env="OPENROUTER_API_KEY",
        provider="openrouter",
    )


def _ollama(name: str) -> Model:
    from handrail.models._openai import OpenAIChat

    # Ollama's OpenAI-compatible endpoint; a local server needs no key (OLLAMA_API_KEY is
    # sent when set, for a server behind a proxy that wants one).
    return OpenAIChat(
        name,
        base_url=os.environ.get("OLLAMA_BASE_URL") or "http://localhost:11434/v1",
        api_key_env="OLLAMA_API_KEY",
        provider="ollama",
    )


def _gemini(name: str) -> Model:
    from handrail.models._openai import OpenAIChat

    return OpenAIChat(
        name,
        base_url=os.environ.get("GEMINI_BASE_URL")
        or "https://generativelanguage.googleapis.com/v1beta/openai",
        api_key_env="GEMINI_API_KEY",
        provider="gemini",
    )


def _anthropic(name: str) -> Model:
    from handrail.models._anthropic import Anthropic

    return Anthropic(name)


_PROVIDERS: dict[str, tuple[Callable[[str], Model], str]] = {
    "anthropic": (_anthropic, "ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL"),
    "gemini": (_gemini, "GEMINI_API_KEY, GEMINI_BASE_URL"),
    "ollama": (_ollama, "OLLAMA_BASE_URL, default http://localhost:11434/v1"),
    "openai": (_openai, "OPENAI_API_KEY, OPENAI_BASE_URL"),
    "openrouter": (_openrouter, "OPENROUTER_API_KEY, OPENROUTER_BASE_URL"),
}

KNOWN_PREFIXES: tuple[str, ...] = tuple(sorted(_PROVIDERS))
"""The provider prefixes a model string may start with."""


def _known() -> str:
    return ", ".join(f"'{p}:<model>' ({env})" for p, (_, env) in sorted(_PROVIDERS.items()))


def infer_model(spec: str | Model | Any) -> Model:
    """The model a string names, or `spec` itself when it already is a `Model`.

    `"openai:<model>"` is `OpenAIChat` (`OPENAI_API_KEY`, `OPENAI_BASE_URL`),
    `"openrouter:<model>"` is `OpenAIChat` on OpenRouter (`OPENROUTER_API_KEY`,
    `OPENROUTER_BASE_URL`), `"ollama:<model>"` is `OpenAIChat` on Ollama's OpenAI-compatible
    endpoint (`OLLAMA_BASE_URL`, default `http://localhost:11434/v1`, no key),
    `"gemini:<model>"` is `OpenAIChat` on Gemini's OpenAI-compatible endpoint
    (`GEMINI_API_KEY`, `GEMINI_BASE_URL`), and `"anthropic:<model>"` is `Anthropic`
    (`ANTHROPIC_API_KEY`, `ANTHROPIC_BASE_URL`). Keys are read at the first request, so an
    agent can be built without one.

    Raises:
        ConfigError: the string has no known prefix, or `spec` is neither a string nor a Model.
    """
    if not isinstance(spec, str):
        if isinstance(spec, Model):
            return spec
        raise ConfigError(
            f"a model must be a model string or a Model, not {type(spec).__name__}; "
            f"known model strings: {_known()}"
        )
    prefix, sep, name = spec.partition(":")
    entry = _PROVIDERS.get(prefix) if sep else None
    if entry is None:
        raise ConfigError(
            f"unknown model string {spec!r}: use one of {_known()}, or pass a Model such as "
            "hr.models.OpenAIChat(<model>, base_url=...) for another compatible server"
        )
    if not name:
        raise ConfigError(f"model string {spec!r} names no model: write '{prefix}:<model>'")
    return entry[0](name)
