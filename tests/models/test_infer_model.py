"""Model strings, the public names of handrail.models, and what importing it costs."""

from __future__ import annotations

import subprocess
import sys

import pytest

import handrail.models as models
from handrail.errors import ConfigError
from handrail.models import Anthropic, OpenAIChat, Scripted, infer_model, reply

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _no_provider_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENROUTER_API_KEY", "ANTHROPIC_API_KEY",
                "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(var, raising=False)


def test_openai_string() -> None:
    model = infer_model("openai:gpt-4.1-mini")
    assert isinstance(model, OpenAIChat)
    assert model.name == "openai:gpt-4.1-mini" and model.model == "gpt-4.1-mini"
    assert model.base_url == "https://api.openai.com/v1"
    assert model.api_key_env == "OPENAI_API_KEY"


def test_openai_string_honours_base_url_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://localhost:8000/v1")
    model = infer_model("openai:qwen3")
    assert isinstance(model, OpenAIChat) and model.base_url == "http://localhost:8000/v1"


def test_openrouter_string() -> None:
    model = infer_model("openrouter:anthropic/claude-sonnet-4.5")
    assert isinstance(model, OpenAIChat)
    assert model.name == "openrouter:anthropic/claude-sonnet-4.5"
    assert model.model == "anthropic/claude-sonnet-4.5"
    assert model.base_url == "https://openrouter.ai/api/v1"
    assert model.api_key_env == "OPENROUTER_API_KEY"


def test_anthropic_string() -> None:
    model = infer_model("anthropic:claude-sonnet-4-5")
    assert isinstance(model, Anthropic)
    assert model.name == "anthropic:claude-sonnet-4-5"
    assert model.base_url == "https://api.anthropic.com"


def test_a_model_passes_through() -> None:
    scripted = Scripted([reply("hi")])
    assert infer_model(scripted) is scripted


@pytest.mark.parametrize("spec", ["gpt-4.1-mini", "gemini:flash", "OpenAI:gpt-4", ":x"])
def test_unknown_prefix_lists_the_known_ones(spec: str) -> None:
    with pytest.raises(ConfigError) as info:
        infer_model(spec)
    message = str(info.value)
    for prefix in ("'anthropic:<model>'", "'openai:<model>'", "'openrouter:<model>'"):
        assert prefix in message


def test_empty_model_name() -> None:
    with pytest.raises(ConfigError, match="names no model"):
        infer_model("openai:")


def test_not_a_model() -> None:
    with pytest.raises(ConfigError, match="not int"):
        infer_model(42)


async def test_missing_key_names_the_variable_and_building_is_offline() -> None:
    model = infer_model("openrouter:x/y")  # no key needed to build an agent
    with pytest.raises(ConfigError, match="OPENROUTER_API_KEY"):
        await model.request([], [])


def test_all_is_sorted_and_complete() -> None:
    assert models.__all__ == sorted(models.__all__)
    public = {n for n in dir(models) if not n.startswith("_")}
    assert set(models.__all__) <= public
    for name in models.__all__:
        assert getattr(models, name) is not None
    with pytest.raises(AttributeError):
        _ = models.NoSuchThing  # type: ignore[attr-defined]


def test_importing_models_does_not_import_httpx() -> None:
    code = (
        "import sys, handrail, handrail.models as m\n"
        "assert 'httpx' not in sys.modules, 'httpx imported early'\n"
        "m.infer_model('openai:gpt-4.1-mini')\n"
        "assert 'httpx' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
