"""What ``ptrain fit --model MODULE:CLASS --help`` says of the class's init arguments (and
``--data``'s): each one's name, annotation, default (or that it is required) and the first
sentence of its description where the class documents it, in a Google (``Args:``), NumPy
(``Parameters`` over a ``----`` line) or Sphinx (``:param NAME:``) style docstring."""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Any

#: an argument that has no default (``InitArgument.default``)
REQUIRED = inspect.Parameter.empty


@dataclass(frozen=True)
class InitArgument:
    """One init argument of a class, as ``--help`` lists it."""

    name: str
    annotation: str  # as written; "" where there is none
    default: Any  # REQUIRED where there is none
    doc: str  # the first sentence of its description; "" where the class does not document it

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def help(self) -> str:
        """``first sentence (int, default: 64)``; ``(int, required)`` without a default."""
        said = [self.annotation] if self.annotation else []
        said.append("required" if self.required else f"default: {_short(repr(self.default))}")
        return f"{self.doc.rstrip('.')} ({', '.join(said)})".strip()


def init_arguments(cls: type, base: type | None = None) -> tuple[list[InitArgument], bool]:
    """The arguments ``cls(...)`` takes by keyword, in order, and whether it also takes any other
    (``**kwargs``). Descriptions come from the docstrings of ``cls`` and its ``__init__``, then
    of the classes it inherits from below ``base``. Raises ``TypeError``/``ValueError`` where
    the signature can't be read. A class that keeps ``base``'s ``__init__`` takes none (the
    ``*args, **kwargs`` it hands to ``torch.nn.Module``'s take nothing)."""
    own = _below(cls, base)
    if base is not None and not any("__init__" in klass.__dict__ for klass in own):
        return [], False
    params = inspect.signature(cls).parameters.values()
    docs = _documented(cls, base)
    arguments = [InitArgument(p.name, _annotation(p.annotation), p.default, docs.get(p.name, ""))
                 for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return arguments, any(p.kind is p.VAR_KEYWORD for p in params)


def _annotation(annotation: Any) -> str:
    if annotation is inspect.Parameter.empty:
        return ""
    if isinstance(annotation, str):  # from __future__ import annotations: as it was written
        return annotation
    if isinstance(annotation, type) and not getattr(annotation, "__args__", None):
        return annotation.__qualname__
    return str(annotation).replace("typing.", "")


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _below(cls: type, base: type | None) -> tuple[type, ...]:
    """``cls`` and the classes it inherits from below ``base`` (``cls`` alone without one)."""
    mro = cls.__mro__
    return mro[:mro.index(base)] if base in mro else (cls,)


def _documented(cls: type, base: type | None) -> dict[str, str]:
    """Argument name -> first sentence of its description, over ``cls``'s own docstring and
    its ``__init__``'s, then those of its bases up to (not including) ``base``."""
    docs: dict[str, str] = {}
    for klass in _below(cls, base):
        init = klass.__dict__.get("__init__")
        for doc in (klass.__dict__.get("__doc__"), getattr(init, "__doc__", None)):
            if isinstance(doc, str):
                for name, said in documented_arguments(doc).items():
                    docs.setdefault(name, said)
    return docs


_SPHINX = re.compile(r"^\s*:(?:param|parameter|arg|argument|key|keyword)\s+"
                     r"(?:[^:]*\s)?\*{0,2}(\w+)\s*:(.*)$")
_GOOGLE_HEADER = re.compile(r"^(Args|Arguments|Parameters|Params|Keyword Args|"
                            r"Keyword Arguments|Other Parameters):\s*$")
_GOOGLE_ENTRY = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:(.*)$")
_NUMPY_HEADERS = ("Parameters", "Other Parameters", "Keyword Arguments")
_NUMPY_ENTRY = re.compile(r"^(\*{0,2}\w+(?:\s*,\s*\*{0,2}\w+)*)\s*(?::.*)?$")


def documented_arguments(doc: str) -> dict[str, str]:
    """Argument name -> the first sentence of its description in docstring ``doc`` (Google,
    NumPy or Sphinx style; a style it does not recognize documents nothing)."""
    lines = inspect.cleandoc(doc).splitlines()
    found: dict[str, list[str]] = {}
    for i, line in enumerate(lines):
        sphinx = _SPHINX.match(line)
        if sphinx:
            found.setdefault(sphinx.group(1), [sphinx.group(2), *_more(lines, i, _indent(line))])
        elif _GOOGLE_HEADER.match(line.strip()):
            _google_section(lines, i, found)
        elif line.strip() in _NUMPY_HEADERS and i + 1 < len(lines) \
                and re.fullmatch(r"\s*-{3,}\s*", lines[i + 1]):
            _numpy_section(lines, i, found)
    return {name: _first_sentence(" ".join(part.strip() for part in text))
            for name, text in found.items() if _first_sentence(" ".join(text))}


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _more(lines: list[str], i: int, indent: int) -> list[str]:
    """The lines after ``lines[i]`` indented deeper than ``indent``, up to a blank one."""
    more = []
    for line in lines[i + 1:]:
        if not line.strip() or _indent(line) <= indent:
            break
        more.append(line)
    return more


def _google_section(lines: list[str], start: int, found: dict[str, list[str]]) -> None:
    header = _indent(lines[start])
    entry_indent = None
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if not line.strip():
            continue
        if _indent(line) <= header:
            return
        if entry_indent is None:
            entry_indent = _indent(line)
        if _indent(line) == entry_indent:
            entry = _GOOGLE_ENTRY.match(line.strip())
            if entry:
                found.setdefault(entry.group(1), [entry.group(2), *_more(lines, i, entry_indent)])


def _numpy_section(lines: list[str], start: int, found: dict[str, list[str]]) -> None:
    header = _indent(lines[start])
    for i in range(start + 2, len(lines)):
        line = lines[i]
        if not line.strip():
            continue
        if i + 1 < len(lines) and re.fullmatch(r"\s*-{3,}\s*", lines[i + 1]):
            return  # the next section's header
        if _indent(line) < header:
            return
        if _indent(line) == header:
            entry = _NUMPY_ENTRY.match(line.strip())
            if entry:
                for name in entry.group(1).split(","):
                    found.setdefault(name.strip().lstrip("*"), _more(lines, i, header))


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    match = re.search(r"(?<=[.!?])\s", text)
    return text[:match.start()] if match else text
