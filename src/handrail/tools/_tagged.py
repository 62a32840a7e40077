"""`TaggedUnion`: a union discriminated by a field, without importing pydantic to say so.

`Annotated[A | B, Field(discriminator="kind")]` at module level imports pydantic (~50 ms) for
anyone importing the module, though only building a validator or a JSON Schema reads it. This
marker carries the same meaning and imports pydantic only when pydantic asks for the schema.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

if TYPE_CHECKING:
    from pydantic import GetCoreSchemaHandler
    from pydantic_core import CoreSchema

__all__ = ["TaggedUnion"]


class TaggedUnion:
    """`Annotated` metadata: the union is discriminated by the field `key`.

    The same as pydantic's `Field(discriminator=key)`: the same validation, errors and JSON
    Schema.
    """

    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key = key

    def __repr__(self) -> str:
        return f"TaggedUnion({self.key!r})"

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler,
                                     ) -> CoreSchema:
        from pydantic import Field

        return handler.generate_schema(Annotated[source, Field(discriminator=self.key)])
