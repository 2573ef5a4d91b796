"""The macOS build (CMakeLists.txt) without a Mac: CMake configured for Darwin, with a fake ``xcrun``.

A source install on a Mac must not fail for want of Apple's Metal compiler (the Command Line Tools lack
it; Xcode 26 needs the separate Metal Toolchain), since torch compiles the sources at run time anyway.
Each fake reproduces one machine: the Command Line Tools only, Xcode 26 without the Metal Toolchain (the
shim is found but fails to run, with Apple's message), and a working Xcode whose ``metal``/``metallib``
write files and record their command lines.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bitsandbytes_mps import _assemble

PACKAGE = Path(__file__).resolve().parents[1]
CMAKE = shutil.which("cmake")
_no_cmake = pytest.mark.skipif(CMAKE is None, reason="needs cmake (not on PATH)")
_no_posix = pytest.mark.skipif(os.name == "nt", reason="needs a POSIX system (the fake xcrun is a #! script)")


def needs_cmake(test):
    return _no_cmake(_no_posix(test))


CLT_ERROR = 'xcrun: error: unable to find utility "metal", not a developer tool or in PATH'
XCODE26_ERROR = (
    "error: cannot execute tool 'metal' due to missing Metal Toolchain; "
    "use: xcodebuild -downloadComponent MetalToolchain"
)

# `xcrun -sdk macosx -f TOOL` and `xcrun -sdk macosx TOOL ARGS...`, as the three machines answer them. Every
# call is appended to the log (one JSON list a line).
FAKE_XCRUN = """\
#!{python}
import json, sys
MACHINE = {machine!r}
with open({log!r}, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
args = sys.argv[1:]
if args[:2] == ["-sdk", "macosx"]:
    args = args[2:]
if args[0] == "-f":
    if MACHINE == "clt":
        print({clt_error!r}, file=sys.stderr)
        sys.exit(72)
    print("/Applications/Xcode.app/Contents/Developer/Toolchains/XcodeDefault.xctoolchain/usr/bin/" + args[1])
    sys.exit(0)
tool, rest = args[0], args[1:]
if MACHINE == "xcode26":
    print({xcode26_error!r}.replace("'metal'", repr(tool)), file=sys.stderr)
    sys.exit(1)
if rest == ["--version"]:
    print("Apple " + tool + " version 32023.fake")
    sys.exit(0)
out = rest[rest.index("-o") + 1]
inputs = [a for a in rest if a.endswith((".metal", ".air"))]
with open(out, "w") as f:
    f.write(tool + " " + " ".join(inputs) + "\\n")
"""


def fake_xcrun(tmp_path: Path, machine: str) -> tuple[Path, Path]:
    """An executable fake ``xcrun`` for ``machine`` ("clt", "xcode26" or "xcode") and its call log."""
    log = tmp_path / "xcrun.log"
    log.touch()
    script = tmp_path / "xcrun"
    text = FAKE_XCRUN.format(
        python=sys.executable, machine=machine, log=str(log), clt_error=CLT_ERROR, xcode26_error=XCODE26_ERROR
    )
    script.write_text(text)
    script.chmod(0o755)
    return script, log


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def cmake(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CMAKE, *args], capture_output=True, text=True, check=False)


def configure(tmp_path: Path, machine: str, *defines: str) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """Configure the package for Darwin (CMake sets APPLE; no compiler is needed: LANGUAGES NONE)."""
    xcrun, log = fake_xcrun(tmp_path, machine)
    build = tmp_path / "build"
    result = cmake(
        "-S",
        str(PACKAGE),
        "-B",
        str(build),
        "--no-warn-unused-cli",  # OFF reads neither BNB_XCRUN nor Python_EXECUTABLE
        "-DCMAKE_SYSTEM_NAME=Darwin",
        f"-DBNB_XCRUN={xcrun}",
        f"-DPython_EXECUTABLE={sys.executable}",
        *(f"-D{d}" for d in defines),
    )
    return result, build, log


def build_and_install(build: Path, prefix: Path) -> list[str]:
    """Build and install; the files installed, relative to ``prefix``."""
    for step in (["--build", str(build)], ["--install", str(build), "--prefix", str(prefix)]):
        result = cmake(*step)
        assert result.returncode == 0, result.stdout + result.stderr
    return sorted(str(p.relative_to(prefix)) for p in prefix.rglob("*") if p.is_file())


MISSING = {
    # machine: what the message must say is missing, and how to get it
    "clt": ("-f metal", CLT_ERROR, "install full Xcode"),
    "xcode26": ("does not run", XCODE26_ERROR, "xcodebuild -downloadComponent MetalToolchain"),
}


@needs_cmake
@pytest.mark.parametrize("machine", sorted(MISSING))
def test_auto_without_metal_compiler_warns_and_builds_nothing(tmp_path, machine):
    result, build, log = configure(tmp_path, machine)
    assert result.returncode == 0, result.stderr
    what, tool_error, how = MISSING[machine]
    # CMake wraps warning text at whitespace: compare with the line breaks undone.
    warning = " ".join(result.stderr.split())
    assert "CMake Warning" in warning
    for expected in ("building no bitsandbytes.metallib", what, tool_error, how, "torch.mps.compile_shader compiles"):
        assert " ".join(expected.split()) in warning, (expected, result.stderr)
    assert build_and_install(build, tmp_path / "prefix") == []
    # Only the probe ran: nothing was compiled.
    assert all("-c" not in c and "-o" not in c for c in calls(log)), calls(log)


@needs_cmake
@pytest.mark.parametrize("machine", sorted(MISSING))
@pytest.mark.parametrize("value", ["ON", "required"])
def test_on_without_metal_compiler_fails_to_configure(tmp_path, machine, value):
    result, _, _ = configure(tmp_path, machine, f"BNB_MPS_METALLIB={value}")
    assert result.returncode != 0
    message = " ".join(result.stderr.split())
    what, tool_error, how = MISSING[machine]
    assert "BNB_MPS_METALLIB=ON, but Apple's Metal compiler is not usable" in message
    for expected in (what, tool_error, how):
        assert " ".join(expected.split()) in message, (expected, result.stderr)


@needs_cmake
@pytest.mark.parametrize("value", ["OFF", "no", "0"])
def test_off_neither_probes_nor_builds(tmp_path, value):
    result, build, log = configure(tmp_path, "xcode", f"BNB_MPS_METALLIB={value}")
    assert result.returncode == 0, result.stderr
    assert "CMake Warning" not in result.stderr
    assert build_and_install(build, tmp_path / "prefix") == []
    assert calls(log) == []


@needs_cmake
def test_unknown_mode_is_refused(tmp_path):
    result, _, log = configure(tmp_path, "xcode", "BNB_MPS_METALLIB=maybe")
    assert result.returncode != 0
    assert "BNB_MPS_METALLIB is 'maybe'; expected AUTO, ON or OFF" in " ".join(result.stderr.split())
    assert calls(log) == []


@needs_cmake
@pytest.mark.parametrize("value", ["AUTO", "ON"])
def test_working_metal_compiler_installs_metallib_and_manifest(tmp_path, value):
    result, build, log = configure(tmp_path, "xcode", f"BNB_MPS_METALLIB={value}")
    assert result.returncode == 0, result.stderr
    assert "CMake Warning" not in result.stderr
    prefix = tmp_path / "prefix"
    installed = build_and_install(build, prefix)
    assert installed == ["bitsandbytes_mps/bitsandbytes.metallib", f"bitsandbytes_mps/{_assemble.MANIFEST_NAME}"]

    sources = _assemble.sources()
    compiles = [c for c in calls(log) if c[2:3] == ["metal"] and "-c" in c]
    compiled = sorted(Path(c[c.index("-c") + 1]).name for c in compiles)
    assert compiled == sorted(sources)
    for c in compiles:
        # The language version of the metallib (bfloat: 3.1), warnings on, no fast math (bytes as the reference).
        for flag in ("-std=metal3.1", "-mmacosx-version-min=14.0", "-fno-fast-math", "-Wall"):
            assert flag in c, shlex.join(c)
        # What metal compiled is the assembled text (prelude + source), which the manifest's digests cover.
        assert Path(c[c.index("-c") + 1]).read_text() == _assemble.assemble(Path(c[c.index("-c") + 1]).name)
    links = [c for c in calls(log) if c[2:3] == ["metallib"] and "-o" in c]
    assert len(links) == 1
    assert sorted(Path(a).stem for a in links[0] if a.endswith(".air")) == sorted(Path(s).stem for s in sources)

    manifest = json.loads((prefix / "bitsandbytes_mps" / _assemble.MANIFEST_NAME).read_text())
    assert manifest == _assemble.manifest()
    assert (prefix / "bitsandbytes_mps" / "bitsandbytes.metallib").read_text().startswith("metallib ")


def _skbuild_settings(monkeypatch, env: dict[str, str], config_settings: dict[str, str]):
    reader = pytest.importorskip("scikit_build_core.settings.skbuild_read_settings", reason="needs scikit-build-core")
    monkeypatch.delenv("BNB_MPS_METALLIB", raising=False)
    monkeypatch.delenv("SKBUILD_CMAKE_DEFINE", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    settings = reader.SettingsReader.from_file(PACKAGE / "pyproject.toml", config_settings, state="wheel").settings
    return settings.cmake.define.get("BNB_MPS_METALLIB")


@pytest.mark.parametrize(
    ("env", "config_settings", "expected"),
    [
        ({}, {}, "AUTO"),
        ({"BNB_MPS_METALLIB": "OFF"}, {}, "OFF"),
        ({}, {"cmake.define.BNB_MPS_METALLIB": "OFF"}, "OFF"),
        ({"BNB_MPS_METALLIB": "OFF"}, {"cmake.define.BNB_MPS_METALLIB": "ON"}, "ON"),
        ({"SKBUILD_CMAKE_DEFINE": "BNB_MPS_METALLIB=OFF"}, {}, "OFF"),
    ],
)
def test_pip_passes_the_option_to_cmake(monkeypatch, env, config_settings, expected):
    """`BNB_MPS_METALLIB=OFF pip install ...` and `pip install -Ccmake.define.BNB_MPS_METALLIB=OFF ...` both
    reach CMake as -DBNB_MPS_METALLIB (the latter wins), as scikit-build-core reads pyproject.toml."""
    assert _skbuild_settings(monkeypatch, env, config_settings) == expected


@needs_cmake
@pytest.mark.parametrize(
    ("machine", "expected"), [("xcode26", []), ("xcode", ["bitsandbytes.metallib", "bitsandbytes.metallib.json"])]
)
def test_wheel_builds_with_or_without_the_metal_compiler(tmp_path, monkeypatch, machine, expected):
    """scikit-build-core end to end, its macOS settings forced (wheel.cmake) and CMake told it is on Darwin:
    without a usable compiler the wheel still builds, without the metallib; with one it holds both files."""
    build = pytest.importorskip("scikit_build_core.build", reason="needs scikit-build-core")
    import zipfile

    xcrun, _ = fake_xcrun(tmp_path, machine)
    package = tmp_path / "package"
    shutil.copytree(PACKAGE, package, ignore=shutil.ignore_patterns("build", "__pycache__", "*.egg-info"))
    monkeypatch.chdir(package)
    monkeypatch.delenv("BNB_MPS_METALLIB", raising=False)
    settings = {
        "wheel.cmake": "true",
        "cmake.define.CMAKE_SYSTEM_NAME": "Darwin",
        "cmake.define.BNB_XCRUN": str(xcrun),
        "cmake.define.Python_EXECUTABLE": sys.executable,
    }
    name = build.build_wheel(str(tmp_path / "dist"), settings)
    with zipfile.ZipFile(tmp_path / "dist" / name) as wheel:
        files = wheel.namelist()
    assert sorted(Path(f).name for f in files if "metallib" in f) == expected
    # the sources and the headers they include, whatever happened to the metallib
    assert {"bitsandbytes_mps/metal/blockwise.metal", "bitsandbytes_mps/metal/quantize.h"} <= set(files)


def test_published_macos_wheel_requires_the_metallib():
    tomllib = pytest.importorskip("tomllib", reason="needs Python 3.11+ (tomllib)")
    config = tomllib.loads((PACKAGE / "pyproject.toml").read_text())["tool"]["cibuildwheel"]["macos"]
    assert config["environment"]["BNB_MPS_METALLIB"] == "ON"


def test_every_source_compile_shader_reads_is_ascii():
    # torch.mps.compile_shader reads the text with NSASCIIStringEncoding: one non-ASCII character fails a family.
    bad = [*_assemble.non_ascii(_assemble.PRELUDE, "_assemble.PRELUDE")]
    for source in _assemble.sources():
        path = _assemble.source_path(source)
        bad += _assemble.non_ascii(path.read_text(encoding="utf-8", errors="replace"), str(path))
    assert not bad, "non-ASCII characters in Metal sources:\n" + "\n".join(bad)
    assert all(_assemble.assemble(source).isascii() for source in _assemble.sources())


def test_assembly_refuses_non_ascii_naming_file_line_and_character(tmp_path, monkeypatch):
    (tmp_path / "odd.metal").write_text(
        textwrap.dedent("""\
            kernel void f() {}
            // 2 \u00d7 3 \u2264 8
            """),
        encoding="utf-8",
    )
    monkeypatch.setattr(_assemble, "METAL_DIR", tmp_path)
    where = str(tmp_path / "odd.metal")
    with pytest.raises(ValueError, match="cannot read") as info:
        _assemble.assemble("odd.metal")
    assert f"{where}:2:6: '\u00d7' (U+00D7)" in str(info.value)
    assert f"{where}:2:10: '\u2264' (U+2264)" in str(info.value)


def test_non_ascii_finder_counts_lines_as_compilers_do():
    # A form feed is a line break to str.splitlines, not to a compiler.
    assert _assemble.non_ascii("a\fb\n\u00e9", "f.metal") == ["f.metal:2:1: '\u00e9' (U+00E9)"]


# --- ci/mps/compile_metal.py: the CI job that compiles every source at each language version torch uses ---

COMPILE_METAL = PACKAGE.parents[1] / "ci" / "mps" / "compile_metal.py"
# Outside a checkout (tests run from an sdist) there is no ci/; inside one a missing script is a failure.
needs_ci_script = pytest.mark.skipif(
    not (PACKAGE.parents[1] / "noxfile.py").is_file(), reason="needs the repository checkout (ci/mps/)"
)

# metal answers per source basename: (exit code, what it prints on stderr); metallib exits LINK_RC.
FAKE_METAL = """\
#!{python}
import json, sys
with open({log!r}, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
args = sys.argv[3:]
out = args[args.index("-o") + 1]
if args[0] == "metallib":
    sys.exit({link_rc})
source = args[args.index("-c") + 1].rsplit("/", 1)[-1]
rc, text = {answers!r}.get(source, (0, ""))
if text:
    print(text, file=sys.stderr)
if rc == 0:
    open(out, "w").write("air")
sys.exit(rc)
"""


def run_compile_metal(tmp_path, *args, answers=None, link_rc=0, env=None):
    log = tmp_path / "xcrun.log"
    log.touch()
    xcrun = tmp_path / "xcrun"
    xcrun.write_text(FAKE_METAL.format(python=sys.executable, log=str(log), answers=answers or {}, link_rc=link_rc))
    xcrun.chmod(0o755)
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, str(COMPILE_METAL), "--xcrun", str(xcrun), "--out", str(out), *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "GITHUB_ACTIONS": "false", **(env or {})},
    )
    return result, calls(log), out


@needs_ci_script
@_no_posix
@pytest.mark.parametrize(("std", "macos"), [("metal3.1", "14.0"), ("metal3.2", "15.0"), ("metal4.0", "26.0")])
def test_ci_compile_runs_every_source_at_the_language_version(tmp_path, std, macos):
    warning = "blockwise.metal:10:5: warning: unused variable 'x' [-Wunused-variable]"
    result, log, out = run_compile_metal(tmp_path, "--std", std, answers={"blockwise.metal": (0, warning)})
    assert result.returncode == 0, result.stdout + result.stderr
    names = _assemble.sources()
    flags = ["-std=" + std, "-mmacosx-version-min=" + macos, "-fno-fast-math", "-Wall"]
    expected = [["-sdk", "macosx", "metal", *flags, "-c", str(out / n), "-o", str(out / (n[: -len(".metal")] + ".air"))]
                for n in names]  # fmt: skip
    assert log[:-1] == expected
    assert log[-1] == [
        "-sdk",
        "macosx",
        "metallib",
        *(c[-1] for c in expected),
        "-o",
        str(out / "bitsandbytes.metallib"),
    ]
    for n in names:  # what it compiled is what compile_shader gets
        assert (out / n).read_text() == _assemble.assemble(n)
    assert warning in result.stdout  # shown, not hidden
    assert "blockwise.metal: ok (1 warnings)" in result.stdout
    assert "link: ok" in result.stdout


@needs_ci_script
@_no_posix
def test_ci_compile_fails_on_a_compile_error_and_names_the_source(tmp_path):
    error = "int8.metal:3:1: error: unknown type name 'bfloat'"
    result, log, _ = run_compile_metal(tmp_path, "--std", "metal3.1", answers={"int8.metal": (1, error)})
    assert result.returncode == 1
    assert error in result.stdout
    assert "int8.metal: FAILED (exit 1, 1 errors, 0 warnings)" in result.stdout
    assert "blockwise.metal: ok (0 warnings)" in result.stdout  # every source is still tried
    assert "link: not tried" in result.stdout
    assert not any(c[2] == "metallib" for c in log)


@needs_ci_script
@_no_posix
def test_ci_compile_fails_when_the_link_fails(tmp_path):
    result, _, _ = run_compile_metal(tmp_path, "--std", "metal3.2", link_rc=1)
    assert result.returncode == 1
    assert "link: FAILED (exit 1)" in result.stdout


@needs_ci_script
@_no_posix
def test_ci_compile_annotates_diagnostics_on_the_repository_files(tmp_path):
    answers = {"blockwise.metal": (0, "blockwise.metal:10:5: warning: unused variable 'x'")}
    result, _, _ = run_compile_metal(tmp_path, "--std", "metal3.1", answers=answers, env={"GITHUB_ACTIONS": "true"})
    assert result.returncode == 0
    path = "packages/backends-mps/src/bitsandbytes_mps/metal/blockwise.metal"
    assert f"::warning file={path},line=10,col=5::unused variable 'x'" in result.stdout


@needs_ci_script
def test_ci_compile_refuses_unknown_language_version_and_missing_xcrun(tmp_path):
    cmd = [sys.executable, str(COMPILE_METAL), "--xcrun", str(tmp_path / "nothing")]
    result = subprocess.run([*cmd, "--std", "metal9.9"], capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert "--std 'metal9.9' has no known macOS; pass --macos-min" in result.stderr
    result = subprocess.run([*cmd, "--std", "metal3.1"], capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert "cannot run" in result.stderr
