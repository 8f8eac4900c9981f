"""The old import path of the contrib op declarations warns and hands out the same objects."""

import pytest

from onnxblocks.optim import contrib_ops


@pytest.mark.parametrize("name", sorted(contrib_ops.__all__))
def test_the_old_path_warns_and_gives_the_same_declaration(name: str) -> None:
    from onnxblocks.optim import contrib

    with pytest.warns(DeprecationWarning, match="onnxblocks.optim.contrib_ops"):
        old = getattr(contrib, name)
    assert old is getattr(contrib_ops, name)


def test_an_unknown_name_is_an_attribute_error() -> None:
    from onnxblocks.optim import contrib

    with pytest.raises(AttributeError, match="NoSuchOp"):
        contrib.NoSuchOp  # noqa: B018
