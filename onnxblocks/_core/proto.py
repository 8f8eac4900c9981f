"""Small protobuf helpers shared by the modules that copy model structure without weights."""

from __future__ import annotations

from collections.abc import Container
from typing import Any


def copy_fields(src: Any, dst: Any, skip: Container[str] = ()) -> None:
    """Copy every set field of protobuf message ``src`` into ``dst``, except the fields named in
    ``skip``.
    """
    for descriptor, value in src.ListFields():
        if descriptor.name in skip:
            continue
        if descriptor.is_repeated:
            getattr(dst, descriptor.name).extend(value)
        elif descriptor.message_type is not None:
            getattr(dst, descriptor.name).CopyFrom(value)
        else:
            setattr(dst, descriptor.name, value)
