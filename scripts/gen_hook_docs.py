"""Write docs/hooks.md from core/ptrain/hookspecs.py (or, with --check, fail if it is stale).

    .venv/bin/python scripts/gen_hook_docs.py          # rewrite docs/hooks.md
    .venv/bin/python scripts/gen_hook_docs.py --check  # exit 1 if docs/hooks.md differs

Each hook's section ends with an example implementation taken from scripts/hook_examples.py
(hookspecs.py holds the contract, the examples live apart). Every example is run and registered
against the specification here, so one that no longer fits the hook fails the generation.
"""

from __future__ import annotations

import __future__
import inspect
import re
import sys
from pathlib import Path

from ptrain import hookspecs
from ptrain.loading import create_plugin_manager, register

SCRIPTS = Path(__file__).resolve().parent
DOC = SCRIPTS.parent / "docs" / "hooks.md"
EXAMPLES = SCRIPTS / "hook_examples.py"
IMPL_MARK = f"{hookspecs.PROJECT_NAME}_impl"
SPEC_MARK = f"{hookspecs.PROJECT_NAME}_spec"
#: Hooks the core calls once per plugin with arguments scoped to it (see hookspecs' docstring).
PER_PLUGIN = ("add_options", "check_available", "state_dict", "load_state_dict",
              "unused_step_hooks")


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


def examples() -> dict[str, str]:
    """Hook name -> its example's source, split from :data:`EXAMPLES` at the ``# == HOOK``
    lines (the file's leading comment is not an example)."""
    parts = re.split(r"^# == (\w+)\n", EXAMPLES.read_text(encoding="utf-8"), flags=re.M)
    return {name: code.strip() + "\n" for name, code in zip(parts[1::2], parts[2::2])}


def check_example(hook: str, code: str) -> None:
    """Run one example on its own and register each class it defines against the specification;
    at least one of them must implement ``hook``. Raises ``ValueError`` naming the problem."""
    module = f"hook_example_{hook}"
    namespace = {"__name__": module}
    exec(compile(code, f"{EXAMPLES}[{hook}]", "exec",
                 flags=__future__.annotations.compiler_flag, dont_inherit=True), namespace)
    classes = [v for v in namespace.values() if inspect.isclass(v) and v.__module__ == module]
    for cls in classes:
        register(create_plugin_manager(), cls, cls.__name__)  # a PluginError if it doesn't fit
    if not any(hasattr(getattr(cls, hook, None), IMPL_MARK) for cls in classes):
        raise ValueError(f"the example for {hook} in {EXAMPLES} defines no class that "
                         f"implements {hook} with @hookimpl")


def render() -> str:
    hooks = hook_functions()
    examples_by_hook = examples()
    names = [f.__name__ for f in hooks]
    if sorted(examples_by_hook) != sorted(names):
        missing = sorted(set(names) - set(examples_by_hook))
        extra = sorted(set(examples_by_hook) - set(names))
        raise ValueError(f"{EXAMPLES} must hold one example per hook; without one: {missing}; "
                         f"not hooks: {extra}")
    for name, code in examples_by_hook.items():
        check_example(name, code)
    intro = inspect.getdoc(hookspecs)
    out = [
        "# Hook reference",
        "",
        "Generated from `core/ptrain/hookspecs.py` by `scripts/gen_hook_docs.py`; a test fails "
        "when the two differ. Import the marker as `from ptrain import hookimpl`. Each hook ends "
        "with an example implementation (from `scripts/hook_examples.py`, checked against the "
        "specification when this page is generated). Writing a plugin: [plugins.md](plugins.md) "
        "and [the tutorial](tutorial-first-plugin.md).",
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
                f"Result semantics: **{semantics(f)}**.", "", inspect.getdoc(f), "",
                "Example:", "", "```python", examples_by_hook[f.__name__].rstrip("\n"), "```", ""]
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
