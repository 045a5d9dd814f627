"""``ptrain new-plugin``: write a new plugin distribution from the templates in ``ptrain/templates``.

What is written for ``ptrain new-plugin NAME --kind KIND`` (folder ``./ptrain-NAME`` by default)::

    ptrain-NAME/
        pyproject.toml          # distribution ptrain-NAME, entry point NAME in GROUPS[KIND]
        README.md               # the plugin's card, to fill in
        ptrain_NAME/__init__.py # a working plugin of that kind, to edit
        tests/test_NAME.py      # the kind's conformance suite from ptrain.testing, and more

(``-`` in NAME becomes ``_`` in the package and the test file.) Lines stay within 100
characters, as in ptrain's own code, for a NAME of up to 24 (see :func:`fit_width`). The
contract: every check runs before anything is written, and nothing is ever overwritten; an
existing folder is used only when it is empty. This module imports neither torch nor any plugin.
"""

from __future__ import annotations

import re
import string
import textwrap
from dataclasses import dataclass
from importlib import metadata, resources
from pathlib import Path

from ptrain._version import __version__, compatible_range
from ptrain.catalog import GROUPS, Catalog
from ptrain.errors import ConfigError
from ptrain.options import closest

KINDS = tuple(GROUPS)  # accelerator, strategy, precision, callback
NAME_PATTERN = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
NAME_RULE = ("lowercase letters and digits, in words joined by single '-' (e.g. my-xpu, fp8-mixed, "
             "grad-norm); it is the entry-point name users type, and the distribution is "
             "ptrain-NAME")
#: Names a new plugin of the kind can't take: the core gives them a meaning.
RESERVED = {"accelerator": {"auto"}}
TEMPLATES = "templates/plugin"


@dataclass(frozen=True)
class KindText:
    """What differs between kinds in the generated text."""

    suffix: str  # of the class name
    select: str  # how a user selects it on the command line ({name} is filled in)
    config: str  # ... in a config file's [trainer] table
    python: str  # ... as a Trainer argument
    imports_torch: bool
    starting_point: str  # what the generated code does, for the README
    options: str  # the README's options section


_NO_OPTIONS = ("None yet. Declare them in `add_options` (a `@staticmethod`); each becomes the flag "
               "`--{name}-OPTION`, the key `OPTION` of `[plugins.{name}]` and a keyword argument "
               "of the class.")

KIND_TEXT = {
    "accelerator": KindText(
        "Accelerator", "--accelerator {name}", 'accelerator = "{name}"', 'accelerator="{name}"',
        True, "trains on the CPU: `check_available`, `setup_device`, `priority` and "
              "`process_group_backend` are where your device goes", _NO_OPTIONS),
    "strategy": KindText(
        "Strategy", "--strategy {name}", 'strategy = "{name}"', 'strategy="{name}"', True,
        "runs one process on one device, as the core's `single-device` does: `launch` and "
        "`wrap_model` are where your strategy goes", _NO_OPTIONS),
    "precision": KindText(
        "Precision", "--precision {name}", 'precision = "{name}"', 'precision="{name}"', True,
        "behaves as the core's `32-true` (float32 everywhere): `precision_policy` and the "
        "wrappers its docstring describes are where your formats go", _NO_OPTIONS),
    "callback": KindText(
        "Callback", "-p {name}", 'callbacks = ["{name}"]', 'callbacks=["{name}"]', False,
        "prints the epoch-level metrics at the end of every `every_n_epochs`-th epoch",
        "| option | flag | default | meaning |\n| --- | --- | --- | --- |\n"
        "| `every_n_epochs` | `--{name}-every-n-epochs` | 1 | epochs between two prints |"),
}


@dataclass(frozen=True)
class PluginSpec:
    """A checked ``NAME``/``KIND`` pair and every name derived from it."""

    name: str
    kind: str

    @property
    def distribution(self) -> str:
        return f"ptrain-{self.name}"

    @property
    def package(self) -> str:
        return "ptrain_" + self.name.replace("-", "_")

    @property
    def group(self) -> str:
        return GROUPS[self.kind]

    @property
    def class_name(self) -> str:
        parts = self.name.split("-")
        suffix = KIND_TEXT[self.kind].suffix
        if parts[-1] == suffix.lower():  # "grad-callback" gives GradCallback, not ...Callback twice
            parts = parts[:-1]
        words = "".join(part.capitalize() for part in parts)
        # an identifier can't start with a digit: "32-fast" gives Precision32Fast
        return suffix + words if not words or words[0].isdigit() else words + suffix

    @property
    def select(self) -> str:
        return KIND_TEXT[self.kind].select.format(name=self.name)

    def files(self) -> dict[str, str]:
        """Relative path -> template name, for every file of the distribution."""
        stem = self.name.replace("-", "_")
        return {
            "pyproject.toml": "pyproject.toml.tmpl",
            "README.md": "README.md.tmpl",
            f"{self.package}/__init__.py": f"{self.kind}.py.tmpl",
            f"tests/test_{stem}.py": f"test_{self.kind}.py.tmpl",
        }


def check_spec(name: str, kind: str, catalog: Catalog) -> PluginSpec:
    """``name`` and ``kind`` as a :class:`PluginSpec`, or a :class:`ConfigError` saying what is
    wrong: a kind that does not exist (the kinds listed), a name that breaks :data:`NAME_RULE`, a
    reserved name, a name an installed plugin of the same kind has (its distribution named), or a
    distribution name that is installed already (installing would replace it)."""
    if kind not in KINDS:
        raise ConfigError(f"unknown plugin kind {kind!r}; the kinds are {', '.join(KINDS)}."
                          f"{closest(kind, KINDS)} Pass one with --kind.")
    if not NAME_PATTERN.fullmatch(name):
        suggestion = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
        hint = f" Try {suggestion!r}." if suggestion and suggestion != name else ""
        raise ConfigError(f"invalid plugin name {name!r}: use {NAME_RULE}.{hint}")
    if name.startswith("ptrain-"):
        raise ConfigError(f"NAME is the plugin's name, without 'ptrain-' (the distribution will "
                          f"be ptrain-NAME); try {name[len('ptrain-'):]!r}.")
    if name in RESERVED.get(kind, ()):
        raise ConfigError(f"{name!r} can't name an {kind}: --{kind} {name} already means "
                          f"something to ptrain. Choose another name.")
    spec = PluginSpec(name, kind)
    claims = catalog.claims(kind, name)
    if claims:
        owners = ", ".join(f"{c.distribution} {c.version} ({c.target})" for c in claims)
        raise ConfigError(f"an installed {kind} plugin is already named {name!r}: {owners}. Two "
                          f"plugins of one kind can't share a name (selecting it would be an "
                          f"error); choose another name.")
    try:
        installed = metadata.distribution(spec.distribution)
    except metadata.PackageNotFoundError:
        return spec
    raise ConfigError(f"a distribution named {spec.distribution} is installed already (version "
                      f"{installed.version}); installing the new plugin would replace it. Choose "
                      f"another name.")


def _template(name: str) -> string.Template:
    source = resources.files("ptrain").joinpath(f"{TEMPLATES}/{name}")
    return string.Template(source.read_text(encoding="utf-8"))


def render(spec: PluginSpec) -> dict[str, str]:
    """Relative path -> content of every file of the new distribution."""
    text = KIND_TEXT[spec.kind]
    core = f"ptrain-core{compatible_range(__version__)}"  # the contract it is written against
    dependencies = (f'["{core}", "torch>=2.13"]' if text.imports_torch else f'["{core}"]')
    values = {
        "name": spec.name,
        "kind": spec.kind,
        "group": spec.group,
        "distribution": spec.distribution,
        "package": spec.package,
        "class_name": spec.class_name,
        "select": spec.select,
        "config_line": text.config.format(name=spec.name),
        "python_arg": text.python.format(name=spec.name),
        "dependencies": dependencies,
        "starting_point": text.starting_point,
        "options": text.options.format(name=spec.name),
    }
    return {path: fit_width(_template(template).substitute(values), path)
            for path, template in spec.files().items()}


#: the longest line of a generated file, as in ptrain's own code; :func:`fit_width` keeps a name
#: up to :data:`LONG_NAME` characters within it (a test checks every kind with such a name)
WIDTH = 100
LONG_NAME = 24  # as long as the longest name of a plugin shipped with ptrain


def fit_width(text: str, path: str) -> str:
    """``text`` with each paragraph of prose that has a line longer than :data:`WIDTH` (a long
    plugin name put into it) filled again to that width: a comment block or a docstring
    paragraph of a ``.py`` file, a comment block of a ``.toml`` file, a paragraph of a ``.md``
    file. Code is left as it is: the templates keep names out of long code lines. Paragraphs
    within the width are left as the template wrote them."""
    lines = text.split("\n")
    out: list[str] = []
    for block in _paragraphs(lines, Path(path).suffix):
        if isinstance(block, str):
            out.append(block)
        elif any(len(line) > WIDTH for line in block[2]):
            first, rest, group = block
            words = " ".join(line[len(rest if i else first):].strip()
                             for i, line in enumerate(group))
            # a code span (`ptrain fit ... -p NAME`) is kept on one line
            words = _CODE_SPAN.sub(lambda m: m.group().replace(" ", "\0"), words)
            out.extend(line.replace("\0", " ") for line in textwrap.wrap(
                words, WIDTH, initial_indent=first, subsequent_indent=rest,
                break_long_words=False, break_on_hyphens=False))
        else:
            out.extend(block[2])
    return "\n".join(out)


_CODE_SPAN = re.compile(r"``[^`]*``|`[^`]*`")
_COMMENT = re.compile(r"(\s*# )\S")
_DOCSTRING = re.compile(r'(\s*)"""')
_NOT_PROSE_MD = ("|", "#", "    ", "```", "- ", "* ")


def _paragraphs(lines: list[str], suffix: str):
    """``lines`` as code lines (``str``) and paragraphs of prose: ``(first line's prefix, the
    other lines' prefix, lines)``."""
    group: list[str] = []
    prefixes = ("", "")

    def flush():
        nonlocal group
        if group:
            yield (*prefixes, group)
        group = []

    in_doc, doc_indent = False, ""
    for line in lines:
        prose = None  # (first prefix, prefix) of the paragraph the line belongs to
        starts = False  # the line starts a paragraph
        if suffix == ".md":
            if line.strip() and not line.startswith(_NOT_PROSE_MD):
                prose = ("", "")
        elif suffix == ".py" and (in_doc or _DOCSTRING.match(line)):
            opening = not in_doc
            if opening:
                doc_indent = _DOCSTRING.match(line).group(1)
                in_doc = line.count('"""') == 1
                prose, starts = (doc_indent + '"""', doc_indent), True
            else:
                in_doc = '"""' not in line
                if line.strip() not in ("", '"""') and line.startswith(doc_indent) \
                        and not line[len(doc_indent):].startswith((" ", ":", "-", ">>>")):
                    prose = (doc_indent, doc_indent)
                    starts = bool(group) and group[-1].rstrip().endswith("::")
        elif suffix in (".py", ".toml") and _COMMENT.match(line):
            indent = _COMMENT.match(line).group(1)
            prose, starts = (indent, indent), prefixes != (indent, indent)
        if prose is None or starts or (group and prefixes[1] != prose[1]):
            yield from flush()
        if prose is None:
            yield line
        else:
            if not group:
                prefixes = prose
            group.append(line)
    yield from flush()


def _check_target(folder: Path) -> None:
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{folder} exists and is not a folder; pass --dir with a new or empty "
                          f"folder.")
    if folder.is_dir():
        entries = sorted(p.name for p in folder.iterdir())
        if entries:
            shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
            raise ConfigError(f"{folder} exists and is not empty ({shown}); nothing was written. "
                              f"Pass --dir with a new or empty folder, or move it away.")


@dataclass(frozen=True)
class Scaffolded:
    """What :func:`new_plugin` did: the spec, the folder, the files written (in order), and notes
    for the user (an installed plugin of another kind with the same name)."""

    spec: PluginSpec
    folder: Path
    files: list[Path]
    notes: list[str]


def new_plugin(name: str, kind: str, folder: str | Path | None = None,
               catalog: Catalog | None = None) -> Scaffolded:
    """Check, render and write the distribution for plugin ``name`` of ``kind`` into ``folder``
    (default ``./ptrain-NAME``)."""
    catalog = catalog if catalog is not None else Catalog.discover()
    spec = check_spec(name, kind, catalog)
    target = Path(folder) if folder is not None else Path.cwd() / spec.distribution
    _check_target(target)
    contents = render(spec)  # everything rendered before the first file is written
    written = []
    for relative, content in contents.items():
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "x", encoding="utf-8") as f:  # "x": never replaces a file
            f.write(content)
        written.append(path)
    notes = [f"{name!r} is also the name of an installed {info.kind} ({info.distribution}); that "
             f"is allowed (names are per kind), but one run can't use both."
             for info in catalog.infos if info.name == name and info.kind != kind]
    return Scaffolded(spec, target, written, notes)


def next_steps(result: Scaffolded) -> str:
    """What ``ptrain new-plugin`` prints: the files, then how to install, list, use and test."""
    spec, target = result.spec, result.folder
    try:
        shown = target.resolve().relative_to(Path.cwd().resolve())
        folder = f"./{shown}" if str(shown) != "." else "."
    except ValueError:
        folder = str(target)
    files = "\n".join(f"  {p.relative_to(target)}" for p in result.files)
    steps = [(f"pip install -e '{folder}[test]'",
              "editable (edits apply without reinstalling), with pytest"),
             ("ptrain plugins", f"lists {spec.kind} {spec.name} ({spec.distribution})"),
             (f"ptrain fit --model MODULE:CLASS {spec.select}", "trains with it"),
             (f"pytest {folder}", "ptrain's conformance suite and the plugin's own tests")]
    width = max(len(command) for command, _ in steps)
    commands = "\n".join(f"  {command.ljust(width)}  # {why}" for command, why in steps)
    notes = "".join(f"\nNote: {note}" for note in result.notes)
    return (f"Created {spec.distribution} in {folder}: the {spec.kind} {spec.name!r} (entry point "
            f"group {spec.group}).\n{files}\n\nNext:\n{commands}\n\n"
            f"Then make it yours in {spec.package}/__init__.py and README.md. The hooks: "
            f"\"Hook reference\" in ptrain's documentation; a walk-through: \"Tutorial: write "
            f"your first plugin\".{notes}")

