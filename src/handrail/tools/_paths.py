"""Argument types the gate understands: `ReadPath`, `WritePath`, `ExecArgv`, `Url`.

A tool argument annotated with one of these is something the call touches, and the gate derives
the action from it at stage 4 (READ/WRITE of the path, EXEC of the argv, NET of the URL's
host), so the policy sees it without the author writing `actions=`. The model is told a plain
string (an array of strings for an argv).

A path is decided and used as one thing. The gate canonicalises a `ReadPath`/`WritePath`
against the workspace when it checks the call; when the body is about to run, the path is
canonicalised again and the call is refused (not sent) if the two differ (a symlink planted in
between, by another call of the turn or by anything else). The body then receives the canonical
`pathlib.Path` (absolute, inside the workspace), never the model's spelling. The workspace file
tools go one step further and open exactly that path component by component with `O_NOFOLLOW`,
so a symlink swapped in after this last check is refused too.

Markers may sit at the top level of a tool's arguments, inside `X | None`, in lists, tuples,
sets and dict values, and in fields of nested pydantic models.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import types
import typing
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import urlsplit

from handrail.errors import Disposition, ToolError, UserError
from handrail.tools._actions import Act, Action
from handrail.tools._workspace import (
    OutsideWorkspace,
    UncanonicalPath,
    canonical_path,
    workspace_root,
)

if TYPE_CHECKING:
    from pydantic import BaseModel, GetCoreSchemaHandler
    from pydantic_core import CoreSchema

__all__ = [
    "OUTSIDE_PLACEHOLDER",
    "PATH_LIKE_NAMES",
    "ArgumentKind",
    "ExecArgv",
    "PathChanged",
    "ReadPath",
    "UnguardedArgumentWarning",
    "Url",
    "WritePath",
    "argument_actions",
    "bind_arguments",
    "scrub_host_paths",
    "unguarded_path_arguments",
    "unguarded_problems",
    "warn_unguarded",
]

PATH_LIKE_NAMES = frozenset({"path", "file", "filename", "dir", "directory", "src", "dst",
                             "url", "cmd", "argv", "command"})
"""Argument names that almost always carry something the policy should see."""


@dataclasses.dataclass(frozen=True, slots=True)
class ArgumentKind:
    """The marker inside `ReadPath` & co.: which action an argument is.

    It also carries the argument's validation, which pydantic asks for only when a tool's
    schema is built: the markers are defined without importing pydantic (issue 11).
    """

    act: Act
    """READ or WRITE (a path), EXEC (an argv) or NET (a URL)."""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler,
                                     ) -> CoreSchema:
        # The marker is always the first metadata of its Annotated (ReadPath & co. are built
        # on the bare type), so nothing sits between `source` and what is added here.
        from pydantic import AfterValidator, BeforeValidator, Field, WithJsonSchema

        extra: tuple[Any, ...]
        if self.act in (Act.READ, Act.WRITE):
            # The model is told a plain string: `format: path` would say nothing it can use.
            extra = (BeforeValidator(_path_text), WithJsonSchema({"type": "string"}))
        elif self.act is Act.EXEC:
            extra = (Field(min_length=1), AfterValidator(_argv))
        else:
            extra = (AfterValidator(_url),)
        return handler.generate_schema(Annotated[(source, *extra)])


def _path_text(value: Any) -> Any:
    # A JSON string only: pydantic would turn "" into Path("."), the workspace root.
    if isinstance(value, Path):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise ValueError("a path is a string")
    if not value:
        raise ValueError("the path is empty")
    if "\x00" in value:
        raise ValueError("the path contains a NUL byte")
    return value


def _argv(value: tuple[str, ...]) -> tuple[str, ...]:
    for word in value:
        if "\x00" in word:
            raise ValueError("an argv word contains a NUL byte")
    return value


_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443, "ftp": 21}


def _url(value: str) -> str:
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"not a valid URL: {exc}") from None
    if not parts.scheme or not parts.hostname:
        raise ValueError("give an absolute URL with a host, such as https://example.com/page")
    if parts.username is not None or parts.password is not None:
        raise ValueError("the URL carries credentials (user:password@); remove them")
    del port
    return value


# Validation and schema come from the marker (ArgumentKind.__get_pydantic_core_schema__).
ReadPath = Annotated[Path, ArgumentKind(Act.READ)]
"""A file or directory the call reads. The body receives its canonical path in the workspace."""
WritePath = Annotated[Path, ArgumentKind(Act.WRITE)]
"""A file the call creates or changes. The body receives its canonical path in the workspace."""
ExecArgv = Annotated[tuple[str, ...], ArgumentKind(Act.EXEC)]
"""A program and its arguments (never a shell string): the call runs it."""
Url = Annotated[str, ArgumentKind(Act.NET)]
"""A URL the call reaches: the policy sees its `host:port`."""


class PathChanged(ToolError):
    """A path resolved to something else at the moment of use than when it was checked."""

    default_disposition = Disposition.NOT_SENT


def net_target(url: str) -> str:
    """The `host:port` (or `host`) a URL reaches; IPv6 hosts in brackets."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    port = parts.port or _DEFAULT_PORTS.get(parts.scheme.lower())
    return host if port is None else f"{host}:{port}"


# ------------------------------------------------------------------ walking annotations

def _kind(annotation: Any) -> ArgumentKind | None:
    if typing.get_origin(annotation) is Annotated:
        for meta in annotation.__metadata__:
            if isinstance(meta, ArgumentKind):
                return meta
    return None


def _marked(annotation: Any, seen: frozenset[int] = frozenset()) -> bool:
    """Whether `annotation` holds an `ArgumentKind` anywhere we can reach."""
    if _kind(annotation) is not None:
        return True
    if id(annotation) in seen:
        return False
    seen = seen | {id(annotation)}
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _marked(typing.get_args(annotation)[0], seen)
    if _is_model_type(annotation):
        return any(_marked(_field_annotation(f), seen) for f in annotation.model_fields.values())
    return any(_marked(a, seen) for a in typing.get_args(annotation) if a is not Ellipsis)


def _is_model_type(annotation: Any) -> bool:
    """Whether `annotation` is a pydantic model class (pydantic imported only if loaded)."""
    if not isinstance(annotation, type):
        return False
    pydantic = sys.modules.get("pydantic")
    # No pydantic loaded means no model class exists yet.
    return pydantic is not None and issubclass(annotation, pydantic.BaseModel)


def _field_annotation(field: Any) -> Any:
    # pydantic strips the top-level Annotated into `metadata`; put it back to walk it.
    if field.metadata:
        return Annotated[(field.annotation, *field.metadata)]
    return field.annotation


def _walk(annotation: Any, value: Any, fn: Callable[[Act, Any], Any]) -> Any:
    """`value` with every marked leaf replaced by `fn(act, leaf)`; unmarked parts kept."""
    kind = _kind(annotation)
    if kind is not None:
        return fn(kind.act, value)
    if value is None or not _marked(annotation):
        return value
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Annotated:
        return _walk(args[0], value, fn)
    if _is_model_type(annotation):
        return _walk_model(value, fn)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _walk(inner[0], value, fn)  # one marked member: checked at definition
    if origin in (list, set, frozenset) or (origin is not None and origin.__name__ in (
            "Sequence", "Set", "AbstractSet", "MutableSequence")):
        walked = [_walk(args[0], v, fn) for v in value]
        return type(value)(walked) if isinstance(value, list | set | frozenset) else walked
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_walk(args[0], v, fn) for v in value)
        return tuple(_walk(a, v, fn) for a, v in zip(args, value, strict=True))
    if origin is dict or (origin is not None and origin.__name__ == "Mapping"):
        return {k: _walk(args[1], v, fn) for k, v in value.items()}
    return value


def _walk_model(model: BaseModel, fn: Callable[[Act, Any], Any]) -> BaseModel:
    update: dict[str, Any] = {}
    for name, field in type(model).model_fields.items():
        annotation = _field_annotation(field)
        if _marked(annotation):
            update[name] = _walk(annotation, getattr(model, name), fn)
    return model.model_copy(update=update) if update else model


def check_markers(owner: str, annotation: Any, where: str) -> None:
    """Refuse a marked type the gate could not walk (a union of two marked members).

    Raises:
        UserError: the annotation holds a marker in a place the gate cannot find.
    """
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Annotated and _kind(annotation) is None:
        check_markers(owner, args[0], where)
    elif origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) > 1 and any(_marked(a) for a in inner):
            raise UserError(f"{owner}: {where} is a union holding hr.ReadPath/WritePath/ExecArgv/"
                            "Url; only `X | None` is supported (use a model for alternatives)")
        for a in inner:
            check_markers(owner, a, where)


# ------------------------------------------------------------------ what the gate uses

def argument_actions(model: BaseModel) -> list[Action]:
    """The actions derived from the marked arguments of validated arguments `model`.

    Paths are given as the model wrote them; the policy canonicalises them.
    """
    found: list[Action] = []

    def collect(act: Act, leaf: Any) -> Any:
        if act is Act.EXEC:
            found.append(Action(act, tuple(leaf)))
        elif act is Act.NET:
            found.append(Action(act, net_target(leaf)))
        else:
            found.append(Action(act, os.fspath(leaf)))
        return leaf

    _walk_model(model, collect)
    return found


def has_marked_arguments(model_type: type[BaseModel]) -> bool:
    """Whether a tool's argument model holds any `ReadPath`/`WritePath`/`ExecArgv`/`Url`."""
    return _marked(model_type)


def bind_arguments(
    model: BaseModel,
    workspace: str | os.PathLike[str] | None,
    decided: Mapping[str, str] | None = None,
) -> BaseModel:
    """`model` with each `ReadPath`/`WritePath` replaced by its canonical absolute path.

    Called at the moment of use. `decided` maps each path as the model wrote it to the
    canonical workspace-relative path the policy decided on; a path that canonicalises to
    something else now is refused.

    Raises:
        PathChanged: a path resolves elsewhere than when it was checked, or outside the
            workspace (not sent).
        UserError: the call has marked paths but no workspace.
    """
    root: str | None = None

    def bind(act: Act, leaf: Any) -> Any:
        nonlocal root
        if act not in (Act.READ, Act.WRITE):
            return leaf
        if workspace is None:
            raise UserError("a tool with hr.ReadPath/hr.WritePath arguments needs an agent "
                            "workspace: give the agent a workspace (or pass workspace= to "
                            "Toolbox.handler)")
        if root is None:
            root = workspace_root(workspace)
        given = os.fspath(leaf)
        try:
            now = canonical_path(given, root)
        except OutsideWorkspace:
            raise PathChanged(f"the path {given!r} resolves outside the workspace; refused, "
                              "nothing was done") from None
        except UncanonicalPath as exc:
            raise PathChanged(f"the path {given!r} is not usable: {exc}") from None
        if decided is not None and decided.get(given) != now:
            raise PathChanged(
                f"the path {given!r} was checked as {decided.get(given)!r} but now leads to "
                f"{now!r} (a symlink changed in between); refused, nothing was done — check the "
                "path and call again"
            )
        return Path(root) if now == "." else Path(root, now)

    return _walk_model(model, bind)


def decided_paths(actions: Sequence[Action], workspace: str | os.PathLike[str] | None,
                  ) -> dict[str, str]:
    """Each READ/WRITE target as given -> its canonical form now (unusable ones left out)."""
    out: dict[str, str] = {}
    root: str | None = None  # resolved only for a call that touches paths: a syscall
    for action in actions:
        if action.act in (Act.READ, Act.WRITE) and isinstance(action.target, str):
            if root is None:
                root = workspace_root(workspace)
            try:
                out[action.target] = canonical_path(action.target, root)
            except ValueError:
                continue
    return out


def _plain_fields(model_type: type[BaseModel]) -> Iterator[tuple[str, str]]:
    for name, field in model_type.model_fields.items():
        key = field.alias or name
        annotation = _field_annotation(field)
        if key.lower() in PATH_LIKE_NAMES and _plain_str(annotation):
            yield key, name


def _plain_str(annotation: Any) -> bool:
    """`str`, `str | None`, or a list/tuple of `str` (an argv), with no marker."""
    if _kind(annotation) is not None:
        return False
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Annotated:
        return _plain_str(args[0])
    if annotation is str:
        return True
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return len(inner) == 1 and _plain_str(inner[0])
    if origin in (list, tuple):
        return bool(args) and args[0] is str and all(a in (str, Ellipsis) for a in args)
    return False


def unguarded_path_arguments(tool: Any) -> list[str]:
    """The arguments of `tool` named like a path, URL or command that the policy cannot see.

    An argument counts when its name is one of `PATH_LIKE_NAMES`, it is not typed
    `hr.ReadPath`/`hr.WritePath`/`hr.ExecArgv`/`hr.Url`, and the tool declares no actions of
    its own (`actions=` for a function, an `actions()` override for a class). Used for the
    warning at definition and by `handrail manifest check --strict`.

    Args:
        tool: A tool (`@hr.tool` function, `hr.Tool` subclass or `ToolImpl`).
    """
    impl = getattr(tool, "__handrail_tool__", tool)
    model_type = getattr(impl, "argument_model", None)
    if model_type is None or getattr(impl, "declares_actions", True):
        return []
    return sorted(key for key, _ in _plain_fields(model_type))


def warn_unguarded(impl: Any) -> None:
    """Warn (at definition) about arguments `unguarded_path_arguments` reports."""
    names = unguarded_path_arguments(impl)
    if names:
        listed = ", ".join(repr(n) for n in names)
        warnings.warn(
            f"tool '{impl.spec.id}': argument(s) {listed} look like a path, URL or command but "
            "are plain strings and the tool declares no actions, so the policy never sees "
            "what they name; type them hr.ReadPath / hr.WritePath / hr.ExecArgv / hr.Url, or "
            "declare actions= (an actions() method on a class)",
            UnguardedArgumentWarning,
            stacklevel=4,
        )


class UnguardedArgumentWarning(UserWarning):
    """A tool argument names a path, URL or command the policy cannot see."""


OUTSIDE_PLACEHOLDER = "<path outside the workspace>"
"""What an absolute path outside the workspace becomes in text shown to a model."""

# An absolute POSIX path: a slash not preceded by a word character, a dot, a colon or another
# slash (so `a/b`, `./x` and `https://host/x` are left alone), then non-space characters up
# to a quote, a bracket or a comma.
_ABSOLUTE = re.compile(r"(?<![\w.:/~-])/[^\s'\"`,;()<>\[\]{}]*")


def scrub_host_paths(text: str, workspace: str | os.PathLike[str] | None) -> str:
    """`text` with host paths made safe to show a model.

    A path under the workspace becomes workspace-relative (`.` for the root); any other
    absolute path becomes `OUTSIDE_PLACEHOLDER`. Used on exception messages from tool bodies
    (an `OSError` names its file by absolute path), which would otherwise tell the model where
    the workspace lives on the host and what lies around it.
    """
    roots: list[str] = []
    if workspace is not None:
        given = os.path.abspath(os.fspath(workspace))
        roots = sorted({given, os.path.realpath(given)}, key=len, reverse=True)

    def replace(match: re.Match[str]) -> str:
        found = match.group(0)
        trailing = ""
        while found and found[-1] in ".:!?":  # sentence punctuation after a path
            trailing = found[-1] + trailing
            found = found[:-1]
        for root in roots:
            prefix = root.rstrip("/") + "/"
            if found == root or found == prefix:
                return "." + trailing
            if found.startswith(prefix):
                return found[len(prefix):] + trailing
        if found == "/" and not trailing:
            return found
        return OUTSIDE_PLACEHOLDER + trailing

    return _ABSOLUTE.sub(replace, text)


def unguarded_problems(impls: Iterable[Any]) -> list[str]:
    """One message per tool of `impls` with arguments `unguarded_path_arguments` reports.

    For `handrail manifest check --strict`, where each is an error.
    """
    found: list[str] = []
    for impl in impls:
        names = unguarded_path_arguments(impl)
        if names:
            listed = ", ".join(repr(n) for n in names)
            found.append(
                f"tool '{impl.spec.id}' ({getattr(impl, 'origin', '?')}): argument(s) {listed} "
                "look like a path, URL or command but are plain strings and the tool declares "
                "no actions — the policy never sees what they name; type them hr.ReadPath / "
                "hr.WritePath / hr.ExecArgv / hr.Url, or declare actions="
            )
    return found
