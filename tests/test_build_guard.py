"""setup.py's compiler guard (build_tools/compiler_guard.py), on the CPU and without building the extension: the
probe tells a compiler that links libstdc++ dynamically from one that copies it in, and the guard switches away
from the latter or stops with the fix."""

from __future__ import annotations

import shutil

import pytest

from build_tools.compiler_guard import ALLOW_STATIC_ENV, links_libstdcxx_dynamically, settle_cxx

SYSTEM_GXX = shutil.which("g++")
pytestmark = pytest.mark.skipif(SYSTEM_GXX is None, reason="needs g++")


@pytest.fixture
def static_cxx(tmp_path):
    """A compiler that links libstdc++ and libgcc statically, as some GPU machines' CXX toolchains do."""
    script = tmp_path / "static-g++"
    script.write_text(f'#!/bin/sh\nexec {SYSTEM_GXX} -static-libstdc++ -static-libgcc "$@"\n')
    script.chmod(0o755)
    return str(script)


def test_system_gxx_links_dynamically():
    assert links_libstdcxx_dynamically(SYSTEM_GXX) is True


def test_static_wrapper_is_seen(static_cxx):
    assert links_libstdcxx_dynamically(static_cxx) is False


def test_a_compiler_that_cannot_build_is_not_judged(tmp_path):
    assert links_libstdcxx_dynamically(str(tmp_path / "no-such-compiler")) is None


def test_dynamic_cxx_is_kept():
    environ = {"CXX": SYSTEM_GXX}
    assert settle_cxx(environ, fallbacks=()) == SYSTEM_GXX
    assert environ == {"CXX": SYSTEM_GXX}


def test_static_cxx_is_switched_to_a_dynamic_one(static_cxx, capsys):
    environ = {"CXX": static_cxx, "CC": static_cxx}
    chosen = settle_cxx(environ, fallbacks=(SYSTEM_GXX,))
    assert chosen == SYSTEM_GXX and environ["CXX"] == SYSTEM_GXX
    assert environ["CC"] != static_cxx and "gcc" in environ["CC"]  # nvcc's host compiler follows (-ccbin $CC)
    message = capsys.readouterr().out
    assert "statically" in message and f"CXX={SYSTEM_GXX}" in message


def test_static_cxx_without_fallback_stops_with_the_fix(static_cxx):
    environ = {"CXX": static_cxx}
    with pytest.raises(SystemExit, match=r"CXX=/usr/bin/g\+\+ \(a compiler that links libstdc\+\+ dynamically\)"):
        settle_cxx(environ, fallbacks=(static_cxx,))
    assert environ == {"CXX": static_cxx}


def test_opt_out_keeps_the_static_cxx(static_cxx, capsys):
    environ = {"CXX": static_cxx, ALLOW_STATIC_ENV: "1"}
    assert settle_cxx(environ, fallbacks=(SYSTEM_GXX,)) == static_cxx
    assert environ["CXX"] == static_cxx
    assert ALLOW_STATIC_ENV in capsys.readouterr().out


@pytest.mark.parametrize("hidden", [("readelf",), ("readelf", "objdump"), ("readelf", "objdump", "nm")])
def test_probe_falls_back_to_other_tools(hidden, static_cxx, monkeypatch):
    """Without readelf (and objdump, and nm) the probe still tells the two apart, through nm's or ldd's view."""
    which = shutil.which
    monkeypatch.setattr("build_tools.compiler_guard.shutil.which", lambda name: None if name in hidden else which(name))
    assert links_libstdcxx_dynamically(SYSTEM_GXX) is True
    assert links_libstdcxx_dynamically(static_cxx) is False
