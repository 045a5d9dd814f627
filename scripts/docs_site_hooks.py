"""MkDocs hooks that put the repository's other documents into the site, so each is written once
and its links work both on the repository and on the site:

- the README is the site's home page (``index.md``) and CHANGELOG.md its ``changelog.md``;
- every plugin distribution's README card is a page under ``cards/`` (``cards/ptrain-ddp.md``);
- the docstrings of the API reference, written in reST for Python's ``help()``, lose the
  role markers (``:class:``) and literal-block markers (``::``) Markdown leaves in them;
- the README's and the cards' absolute links into the repository (they are the distributions'
  long descriptions) lead to the site's pages;
- a link from ``docs/`` to a card (``../plugins/strategies/ddp/README.md``, or an example
  plugin's folder) leads to its page, a card's link into ``docs/`` to that page, and the
  README's ``docs/X.md`` to ``X.md``.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parent.parent  # scripts/ is one level down
_FOLDER = r"(examples/plugins/[a-z_]+|plugins/[a-z_]+/[a-z_]+)"  # a plugin distribution's
_CARD_LINK = re.compile(r"\]\(\.\./" + _FOLDER + r"(?:/README\.md)?(#[^)]*)?\)")
_README_LINK = re.compile(r"\]\(\.\./README\.md(#[^)]*)?\)")


def _cards() -> dict[str, str]:
    """Repository folder of each plugin distribution -> its distribution name."""
    folders = sorted(REPO.glob("plugins/*/*/pyproject.toml")) + sorted(
        REPO.glob("examples/plugins/*/pyproject.toml"))
    return {str(p.parent.relative_to(REPO)): tomllib.loads(p.read_text())["project"]["name"]
            for p in folders}


def on_config(config):
    """The nav gains a "Plugin cards" section (one page per plugin distribution) and the
    changelog."""
    config["nav"].append({"Plugin cards": [{name: f"cards/{name}.md"}
                                           for name in sorted(_cards().values())]})
    config["nav"].append({"Changelog": "changelog.md"})
    return config


def on_files(files: Files, config) -> Files:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    files.append(File.generated(config, "index.md", content=readme))
    changelog = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    files.append(File.generated(config, "changelog.md", content=changelog))
    for folder, name in _cards().items():
        card = (REPO / folder / "README.md").read_text(encoding="utf-8")
        files.append(File.generated(config, f"cards/{name}.md", content=card))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    cards = _cards()
    where = page.file.src_uri
    prefix = "../" if where.startswith("cards/") else ""

    def to_card(match: re.Match) -> str:
        name = cards.get(match.group(1))
        if name is None:  # not a distribution's folder: leave it for the link check to name
            return match.group(0)
        return f"]({prefix}cards/{name}.md{match.group(2) or ''})"

    # the README and the cards are long descriptions too, whose links are absolute (a package
    # index page can't resolve a path): on the site they lead to its pages again
    source = f"]({config['repo_url']}/blob/main/"
    if where == "index.md":  # the README: its links are relative to the repository root
        markdown = markdown.replace(source, "](")
        markdown = re.sub(r"\]\(docs/", "](", markdown)
        markdown = markdown.replace("](CHANGELOG.md)", "](changelog.md)")
        markdown = markdown.replace("](LICENSE)", f"]({config['repo_url']}/blob/main/LICENSE)")
        return re.sub(r"\]\(" + _FOLDER + r"(?:/README\.md)?\)",
                      lambda m: f"](cards/{cards[m.group(1)]}.md)" if m.group(1) in cards
                      else m.group(0), markdown)
    if where.startswith("cards/"):  # a card: its links are relative to its folder
        markdown = markdown.replace(source + "docs/", "](../../../docs/")
        return re.sub(r"\]\((?:\.\./)+docs/", "](../", markdown)
    markdown = _README_LINK.sub(lambda m: f"](index.md{m.group(1) or ''})", markdown)
    return _CARD_LINK.sub(to_card, markdown)


#: a reST role as Markdown renders it: ``:class:`~pkg.Name``` -> ``:class:<code>~pkg.Name</code>``
_ROLE = re.compile(r":(?:class|meth|func|attr|mod|exc|data|obj):<code>(~?)([^<]*)</code>")


def on_page_content(html: str, page, config, files) -> str:
    """reST roles become plain code (``~pkg.Name`` its last part, as Sphinx shows it); a
    paragraph that is only ``::`` goes, and one ending in ``::`` ends in ``:``."""
    def plain(match: re.Match) -> str:
        tilde, name = match.groups()
        return f"<code>{name.rsplit('.', 1)[-1] if tilde else name}</code>"

    html = _ROLE.sub(plain, html)
    html = html.replace("<p>::</p>", "")
    return html.replace("::</p>", ":</p>")
