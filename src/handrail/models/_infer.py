"""`infer_model`: a model string such as `"openai:gpt-4.1-mini"` to a `Model`."""

from __future__ import annotations

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
        base_url="https://openrouter.ai/api/v1",
        api_key_env="OPENROUTER_API_KEY",
        provider="openrouter",
    )


def _anthropic(name: str) -> Model:
    from handrail.models._anthropic import Anthropic

    return Anthropic(name)


_PROVIDERS: dict[str, tuple[Callable[[str], Model], str]] = {
    "anthropic": (_anthropic, "ANTHROPIC_API_KEY"),
    "openai": (_openai, "OPENAI_API_KEY, OPENAI_BASE_URL"),
    "openrouter": (_openrouter, "OPENROUTER_API_KEY"),
}

KNOWN_PREFIXES: tuple[str, ...] = tuple(sorted(_PROVIDERS))
"""The provider prefixes a model string may start with."""


def _known() -> str:
    return ", ".join(f"'{p}:<model>' ({env})" for p, (_, env) in sorted(_PROVIDERS.items()))


def infer_model(spec: str | Model | Any) -> Model:
    """The model a string names, or `spec` itself when it already is a `Model`.

    `"openai:<model>"` is `OpenAIChat` (`OPENAI_API_KEY`, `OPENAI_BASE_URL`),
    `"openrouter:<model>"` is `OpenAIChat` on OpenRouter (`OPENROUTER_API_KEY`), and
    `"anthropic:<model>"` is `Anthropic` (`ANTHROPIC_API_KEY`). Keys are read at the first
    request, so an agent can be built without one.

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
