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
                "ANTHROPIC_BASE_URL", "OPENROUTER_BASE_URL", "OLLAMA_BASE_URL", "OLLAMA_API_KEY",
                "GEMINI_API_KEY", "GEMINI_BASE_URL"):
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


@pytest.mark.parametrize("spec", ["gpt-4.1-mini", "mistral:small", "OpenAI:gpt-4", ":x"])
def test_unknown_prefix_lists_the_known_ones(spec: str) -> None:
    with pytest.raises(ConfigError) as info:
        infer_model(spec)
    message = str(info.value)
    for prefix in ("'anthropic:<model>'", "'openai:<model>'", "'openrouter:<model>'",
                   "'ollama:<model>'", "'gemini:<model>'"):
        assert prefix in message


def test_ollama_string_is_the_local_openai_compatible_endpoint() -> None:
    model = infer_model("ollama:llama3.2")
    assert isinstance(model, OpenAIChat)
    assert model.name == "ollama:llama3.2" and model.model == "llama3.2"
    assert model.base_url == "http://localhost:11434/v1"


def test_gemini_string_is_the_openai_compatible_endpoint() -> None:
    model = infer_model("gemini:gemini-2.5-flash")
    assert isinstance(model, OpenAIChat)
    assert model.name == "gemini:gemini-2.5-flash"
    assert model.base_url == "https://generativelanguage.googleapis.com/v1beta/openai"
    assert model.api_key_env == "GEMINI_API_KEY"


@pytest.mark.parametrize(("spec", "var"), [("ollama:m", "OLLAMA_BASE_URL"),
                                           ("gemini:m", "GEMINI_BASE_URL"),
                                           ("openrouter:m", "OPENROUTER_BASE_URL"),
                                           ("anthropic:m", "ANTHROPIC_BASE_URL")])
def test_each_provider_base_url_can_be_overridden(monkeypatch: pytest.MonkeyPatch, spec: str,
                                                  var: str) -> None:
    monkeypatch.setenv(var, "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://wrong.invalid/v1")
    assert infer_model(spec).base_url == "http://127.0.0.1:9/v1"  # type: ignore[attr-defined]


async def test_gemini_needs_its_key_and_ollama_sends_none(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from model_server import Reply, serve

    with pytest.raises(ConfigError, match="GEMINI_API_KEY"):
        await infer_model("gemini:m").request([], [])
    body = {"choices": [{"message": {"role": "assistant", "content": "hi"},
                         "finish_reason": "stop"}], "model": "m"}
    async with serve([Reply(200, body)]) as server:
        monkeypatch.setenv("OLLAMA_BASE_URL", f"{server.url}/v1")
        async with infer_model("ollama:llama3.2") as model:  # type: ignore[attr-defined]
            response = await model.request([], [])
        assert response.message.text == "hi"
        (received,) = server.requests
        assert received.path == "/v1/chat/completions"
        assert "authorization" not in {k.lower() for k in received.headers}
        assert b'"model":"llama3.2"' in received.body


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
