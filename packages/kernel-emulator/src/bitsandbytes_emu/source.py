"""Turning a kernel source into the one translation unit the host compiler builds.

The source is compiled as written, with one mechanical exception: ``extern __shared__ T name[];`` (dynamic
shared memory) has no host C++ spelling, so each such declaration becomes a pointer to the block's
dynamic shared memory. ``#line`` directives keep every diagnostic pointing at the original file and line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_DYNAMIC_SHARED = re.compile(
    r"extern\s+__shared__\s+"
    r"(?:(?:__align__|alignas)\s*\(\s*\w+\s*\)\s*)*"
    r"(?P<type>[A-Za-z_][\w:\s<>,*]*?)\s*"
    r"(?:(?:__align__|alignas)\s*\(\s*\w+\s*\)\s*)*"
    r"\b(?P<name>[A-Za-z_]\w*)\s*\[\s*\]\s*;"
)

_COMMENT_OR_STRING = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
_SCOPE_OPENER = re.compile(r"(?:\bnamespace\b[\w\s:]*|\bextern\s+\"C\"\s*)$")


def _blank(match: re.Match) -> str:
    # Same length, newlines kept: offsets and line numbers stay valid in the blanked copy.
    return re.sub(r"[^\n]", " ", match.group(0))


def _in_function(blanked: str, pos: int) -> bool:
    """Whether ``pos`` lies inside a function body (braces that are not namespace or extern "C" blocks)."""
    stack: list[bool] = []
    last = 0
    for m in re.finditer(r"[{};]", blanked[:pos]):
        c = m.group(0)
        if c == "{":
            head = blanked[last : m.start()].strip()
            stack.append(not _SCOPE_OPENER.search(head))
        elif c == "}" and stack:
            stack.pop()
        last = m.end()
    return any(stack)


def rewrite_dynamic_shared(text: str, filename: str) -> str:
    """Replace every ``extern __shared__ T name[];`` by a pointer to the dynamic shared memory."""
    blanked = _COMMENT_OR_STRING.sub(_blank, text)
    out: list[str] = []
    last = 0
    for m in _DYNAMIC_SHARED.finditer(blanked):
        type_, name = " ".join(m.group("type").split()), m.group("name")
        pointer = f"reinterpret_cast<{type_}*>(::bnb_emu::dynamic_shared())"
        out.append(text[last : m.start()])
        if _in_function(blanked, m.start()):
            out.append(f"{type_}* const {name} = {pointer};")
        else:
            line = text.count("\n", 0, m.end()) + 1
            out.append(f'\n#undef {name}\n#define {name} ({pointer})\n#line {line} "{_escape(filename)}"\n')
        last = m.end()
    out.append(text[last:])
    return "".join(out)


def _escape(path: str) -> str:
    return path.replace("\\", "\\\\").replace('"', '\\"')


def translation_unit(text: str, filename: str, dialect: str, exports: Mapping[str, str]) -> str:
    """The generated file: the shim, the (rewritten) kernel source, and one export per kernel."""
    body = rewrite_dynamic_shared(text, filename) if dialect == "cuda" else text
    macro = f"BNB_EMU_{dialect.upper()}_EXPORT"
    lines = [f'#line 1 "{_escape(filename)}"', body, '#line 1 "<bnb_emu exports>"']
    lines += [f"{macro}({name}, {expr})" for name, expr in exports.items()]
    return "\n".join(lines) + "\n"


def parameter_names(text: str, function: str) -> list[str] | None:
    """Best-effort parameter names of kernel ``function`` in ``text`` (for messages); None if not found."""
    blanked = _COMMENT_OR_STRING.sub(_blank, text)
    for m in re.finditer(r"\b" + re.escape(function) + r"\s*\(", blanked):
        head = blanked[max(0, m.start() - 200) : m.start()]
        if not re.search(r"\b(__global__|kernel)\b[^;{}]*$", head):
            continue
        depth, i = 1, m.end()
        while i < len(blanked) and depth:
            depth += {"(": 1, ")": -1}.get(blanked[i], 0)
            i += 1
        params = _split_top_level(blanked[m.end() : i - 1])
        names = []
        for p in params:
            p = re.sub(r"\[\[.*?\]\]", " ", p).split("=")[0]
            words = re.findall(r"[A-Za-z_]\w*", p)
            if not words:
                return None
            names.append(words[-1])
        return names
    return None


def _split_top_level(params: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for c in params:
        if c in "(<[":
            depth += 1
        elif c in ")>]":
            depth -= 1
        if c == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return [p for p in parts if p.strip() and p.strip() != "void"]
