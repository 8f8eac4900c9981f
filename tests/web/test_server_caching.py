"""What the site server tells browsers to cache (``onnxblocks.web.server``).

onnxruntime-web's runtime files (``ort/``) are kept and revalidated, so Chromium keeps the
optimized code it compiled from the WASM with the file and a later visit trains at full speed
from its first step (docs/web.md, "WASM speed"); every other file is never stored, so a rebuilt
site is never mixed with a cached one.
"""

from __future__ import annotations

import email.utils
import urllib.error
import urllib.request

import pytest

from onnxblocks.web.server import serving


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    (site / "ort").mkdir()
    (site / "ort" / "ort-wasm-simd-threaded.wasm").write_bytes(b"\0asm\1\0\0\0")
    (site / "demo").mkdir()
    (site / "demo" / "index.html").write_text("<!doctype html>", encoding="utf-8")
    with serving(site) as address:
        yield address


def test_the_runtime_is_revalidated_and_everything_else_never_stored(url):
    with urllib.request.urlopen(f"{url}ort/ort-wasm-simd-threaded.wasm") as response:
        assert response.headers["Cache-Control"] == "no-cache"
        assert response.headers["Content-Type"] == "application/wasm"
        assert response.headers["Cross-Origin-Embedder-Policy"] == "require-corp"
        modified = response.headers["Last-Modified"]
    with urllib.request.urlopen(f"{url}demo/index.html") as response:
        assert response.headers["Cache-Control"] == "no-store"
        assert response.headers["Cross-Origin-Opener-Policy"] == "same-origin"
    assert email.utils.parsedate_to_datetime(modified) is not None


def test_an_unchanged_runtime_file_answers_not_modified(url):
    request = urllib.request.Request(f"{url}ort/ort-wasm-simd-threaded.wasm")
    with urllib.request.urlopen(request) as response:
        request.add_header("If-Modified-Since", response.headers["Last-Modified"])
    with pytest.raises(urllib.error.HTTPError) as answer:
        urllib.request.urlopen(request)
    assert answer.value.code == 304
    assert answer.value.headers["Cache-Control"] == "no-cache"
