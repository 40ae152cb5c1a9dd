"""The one encoder and decoder of edgekv's typed messages and blocks (msgspec Structs, and the dataclasses inside
them): :func:`to_wire` turns one into plain JSON-ready values, :func:`decoder` makes the strict reader of one type
(``msgspec.ValidationError`` when a payload is not one).  The child protocols (:mod:`edgekv.core.probe`,
:mod:`edgekv.core.benchwire`, :mod:`edgekv.core.qualitywire`) and the results blocks use them; :func:`desc` (or
:func:`doc`) gives a field its description, from which the results' JSON Schema is generated.  Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import msgspec

T = TypeVar("T")


def to_wire(obj: Any) -> Any:
    """A Struct or dataclass (or a list of them) as plain JSON-ready values, in field order."""
    return msgspec.to_builtins(obj)


def decoder(typ: type[T]) -> Callable[[Any], T]:
    """The reader of one message type: plain values -> ``typ``, strictly (msgspec.ValidationError when not one)."""

    def decode(payload: Any) -> T:
        return msgspec.convert(payload, typ)

    decode.__doc__ = f"A {typ.__name__} decoded from its JSON payload (msgspec.ValidationError when it is not one)."
    return decode


def desc(text: str) -> msgspec.Meta:
    """A field's description (the JSON Schema's ``description``), as ``Annotated[type, desc("...")]``: a form
    mypy reads, unlike :func:`doc`'s."""
    return msgspec.Meta(description=text)


def doc(t: Any, text: str) -> Any:
    """A field's type with its description; the same as ``Annotated[t, desc(text)]``."""
    return Annotated[t, desc(text)]
