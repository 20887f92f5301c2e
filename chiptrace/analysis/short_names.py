"""Readable names for the text and HTML reports: real kernel names are C++ signatures
that run to 2,000 characters (`void fbgemm_gpu::..._kernel<c10::Half, float, ...>(at::
GenericPackedTensorAccessor<...>, ...)`). The report JSON keeps the full names.
"""

from __future__ import annotations

import re

WIDTH = 72
ELLIPSIS = "\u2026"
# A C++ signature: a template list, a qualified name, or an identifier directly followed by
# its argument list (`Memcpy HtoD (Pinned -> Device)` is none of these and stays as it is).
_CPP = re.compile(r"<|::|^[\w~]+\(")
_ANON = re.compile(r"\((anonymous|anonymous namespace)\)::")


def _split_top(s: str) -> tuple[str, str | None, str, bool] | None:
    """(name before its template list, the template's arguments or None, what follows the
    template up to the argument list, whether there is an argument list); None when the
    brackets do not balance."""
    depth = 0
    start = tpl_end = -1
    for i, ch in enumerate(s):
        if ch in "<(":
            if depth == 0 and ch == "(":
                break
            if depth == 0 and start < 0:
                start = i
            depth += 1
        elif ch in ">)" and depth and not (ch == ">" and i and s[i - 1] == "-"):
            depth -= 1
            if depth == 0 and tpl_end < 0:
                tpl_end = i
    else:
        i = len(s)
        if depth:
            return None
    if start < 0 or tpl_end < 0:
        return s[:i], None, "", i < len(s)
    return s[:start], s[start + 1 : tpl_end], s[tpl_end + 1 : i], i < len(s)


def _close(s: str, i: int) -> int:
    depth = 0
    for j in range(i, len(s)):
        if s[j] in "<(":
            depth += 1
        elif s[j] in ">)" and not (s[j] == ">" and s[j - 1] == "-"):
            depth -= 1
            if depth == 0:
                return j + 1
    return len(s)


def _args(tpl: str, budget: int = 36) -> str:
    """Top-level template arguments, each without namespaces or its own lists, as many as
    fit in `budget` characters: `4, at::native::FillFunctor<float>, ...` -> `4, FillFunctor, …`."""
    parts, depth, cur = [], 0, ""
    for ch in tpl:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        if depth == 0 and ch not in ">)":
            cur += ch
    parts.append(cur)
    out: list[str] = []
    for p in (p.strip().rsplit("::", 1)[-1].strip() for p in parts):
        if out and len(", ".join([*out, p])) > budget:  # the first always: it names the kernel
            out.append(ELLIPSIS)
            break
        out.append(p)
    return ", ".join(out)


def _strip_lists(s: str) -> str:
    """`ns::f<T, x::U<V>>(int, X<Y>) const` -> `ns::f<T, U>(…)`: the argument list cut, the
    template list to its top-level arguments without namespaces (kernels differ by them)."""
    parts = _split_top(s)
    if parts is None:
        return s
    name, tpl, between, call = parts
    out = name.strip()
    if tpl is not None:
        out += f"<{_args(tpl)}>" + _strip_lists(between) if between else f"<{_args(tpl)}>"
    return out + ("(" + ELLIPSIS + ")" if call else "")


def short_name(name: str | None, width: int = WIDTH) -> str:
    """A C++ kernel or function name as its qualified name with `<…>` and `(…)` for the
    top-level template arguments (`void ` and anonymous namespaces dropped); a name longer
    than `width` loses its template arguments, then leading namespaces, then its middle,
    to an ellipsis."""
    if name is None:
        return "-"
    s = " ".join(str(name).split())
    if _CPP.search(s):
        s = _ANON.sub("", s)
        s = s[5:] if s.startswith("void ") else s
        s = _strip_lists(s) or s
    if len(s) <= width:
        return s
    bare = re.sub(r"<[^()]*>(?=\(|$)", "<" + ELLIPSIS + ">", s)  # template arguments go next
    if len(bare) <= width:
        return bare
    s = bare
    if "::" in s:  # keep the function, drop leading namespaces
        tail = s
        while len(tail) > width - 1 and "::" in tail:
            tail = tail.split("::", 1)[1]
        if len(tail) <= width - 1:
            return ELLIPSIS + tail
        s = tail
    # Cut the middle: kernel variants differ at the end (`..._cta_per_row_1`, `..._warp_...`).
    head = (width - 1) * 2 // 5
    return s[:head] + ELLIPSIS + s[len(s) - (width - 1 - head) :]


_START = re.compile(r"(?:void )?[A-Za-z_~][\w:~]*[<(]")


def shorten_in(text: str, width: int = WIDTH) -> str:
    """`text` (a suggestion, evidence) with every C++ signature longer than `width` in it
    shortened as `short_name` does."""
    out, i = [], 0
    for m in _START.finditer(text):
        if m.start() < i:
            continue
        end = _close(text, m.end() - 1)
        if text[m.end() - 1] == "<" and end < len(text) and text[end] == "(":
            end = _close(text, end)
        if end - m.start() > width:
            out += [text[i : m.start()], short_name(text[m.start() : end], width)]
            i = end
    return "".join(out) + text[i:]
