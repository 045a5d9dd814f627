"""Write docs/hooks.md from core/ptrain/hookspecs.py (or, with --check, fail if it is stale).

    .venv/bin/python scripts/gen_hook_docs.py          # rewrite docs/hooks.md
    .venv/bin/python scripts/gen_hook_docs.py --check  # exit 1 if docs/hooks.md differs
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

from ptrain import hookspecs

DOC = Path(__file__).resolve().parent.parent / "docs" / "hooks.md"
SPEC_MARK = f"{hookspecs.PROJECT_NAME}_spec"
#: Hooks the core calls once per plugin with arguments scoped to it (see hookspecs' docstring).
PER_PLUGIN = ("add_options", "check_available", "state_dict", "load_state_dict")


def hook_functions() -> list:
    """The hooks in the order the specification defines them."""
    members = [f for f in vars(hookspecs).values()
               if inspect.isfunction(f) and hasattr(f, SPEC_MARK)]
    return sorted(members, key=lambda f: f.__code__.co_firstlineno)


def signature(function) -> str:
    """``def name(arg: Type, ...) -> Result`` exactly as written in the specification."""
    return f"def {function.__name__}{inspect.signature(function)}".replace("'", "")


def semantics(function) -> str:
    if function.__name__ in PER_PLUGIN:
        return "per plugin"
    return "firstresult" if getattr(function, SPEC_MARK).get("firstresult") else "all"


def render() -> str:
    hooks = hook_functions()
    intro = inspect.getdoc(hookspecs)
    out = [
        "# Hook reference",
        "",
        "Generated from `core/ptrain/hookspecs.py` by `scripts/gen_hook_docs.py`; a test fails "
        "when the two differ. Import the marker as `from ptrain import hookimpl`.",
        "",
        "| hook | result | summary |",
        "| --- | --- | --- |",
    ]
    for f in hooks:
        summary = inspect.getdoc(f).splitlines()[0]
        out.append(f"| [`{f.__name__}`](#{f.__name__}) | {semantics(f)} | {summary} |")
    out += ["", "## The loop and the rules", "", intro, ""]
    for f in hooks:
        out += [f"## {f.__name__}", "", "```python", signature(f), "```", "",
                f"Result semantics: **{semantics(f)}**.", "", inspect.getdoc(f), ""]
    return "\n".join(out)


def main() -> int:
    text = render()
    if "--check" in sys.argv:
        if not DOC.is_file() or DOC.read_text(encoding="utf-8") != text:
            print(f"{DOC} is stale: run python scripts/gen_hook_docs.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text, encoding="utf-8")
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
