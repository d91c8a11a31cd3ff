"""The man pages in man/ are what man/manpages.py makes of today's parsers and config.

A changed option, help text or config comment without ``make man`` fails here,
naming the page and the first line that differs.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
MAN = REPO / "man"


def _generator():
    spec = importlib.util.spec_from_file_location("flexiqd_manpages", MAN / "manpages.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generator():
    return _generator()


@pytest.fixture(scope="module")
def rendered(generator):
    return generator.render_all()


def test_every_command_and_the_config_have_a_page(rendered):
    assert sorted(rendered) == ["flexiq.1", "flexiqctl.1", "flexiqd.8", "flexiqd.yaml.5"]


@pytest.mark.parametrize("page", ["flexiq.1", "flexiqctl.1", "flexiqd.8", "flexiqd.yaml.5"])
def test_the_committed_page_is_what_the_generator_makes_now(rendered, page):
    committed = (MAN / page).read_text() if (MAN / page).exists() else ""
    diff = list(difflib.unified_diff(committed.splitlines(), rendered[page].splitlines(),
                                     f"man/{page} (committed)", f"man/{page} (generated)", lineterm="", n=1))
    assert not diff, f"man/{page} is out of date; run `make man`:\n" + "\n".join(diff[:30])


def test_the_pages_do_not_depend_on_the_environment(generator, monkeypatch):
    before = generator.render_all()
    monkeypatch.setenv("FLEXIQ_URL", "sqlite:////elsewhere/queue.db")
    monkeypatch.setenv("COLUMNS", "33")
    assert generator.render_all() == before


def _all_parsers(parser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _all_parsers(sub)


def _roff_bold(text):
    return "\\fB" + text.replace("-", "\\-") + "\\fR"


def test_every_option_of_every_command_is_on_its_page(generator, rendered):
    for page in generator.PAGES:
        if page.parser is None:
            continue
        for parser in _all_parsers(page.parser()):
            for action in parser._actions:
                for option in action.option_strings:
                    if option in ("-h", "--help") and parser.prog != page.name:
                        continue  # said once, at the top
                    assert _roff_bold(option) in rendered[page.filename], \
                        f"{page.filename} lacks {parser.prog} {option}"


def test_the_config_page_has_every_key_of_the_shipped_config(generator, rendered):
    import yaml

    def yaml_paths(mapping, prefix=""):
        for name, value in mapping.items():
            yield prefix + name
            if isinstance(value, dict):
                yield from yaml_paths(value, f"{prefix}{name}.")

    def tree_paths(keys, prefix=""):
        for key in keys:
            if not key.example:
                yield prefix + key.name, key
                yield from tree_paths(key.children, f"{prefix}{key.name}.")

    text = (REPO / "units" / "flexiqd.yaml").read_text()
    _title, _header, keys = generator.parse_config_example(text)
    documented = dict(tree_paths(keys))
    # Keys inside a flow mapping ({workers: 4, ...}) are documented with their parent.
    expected = {path for path in yaml_paths(yaml.safe_load(text))
                if path.rpartition(".")[0] not in documented or not documented[path.rpartition(".")[0]].value}
    assert set(documented) == expected
    for path in documented:
        assert _roff_bold(path.rsplit(".", 1)[-1] + ":") in rendered["flexiqd.yaml.5"], f"flexiqd.yaml(5) lacks {path}"


def test_a_commented_key_is_an_example_nested_where_its_comment_sits(generator):
    _title, header, keys = generator.parse_config_example(
        "# /etc/x.yaml -- the title.\n"
        "#\n"
        "# The header.\n"
        "\n"
        "# The store.\n"
        "store: sqlite:///q.db\n"
        "deps: {}\n"
        "#  db:\n"
        "#    capacity: 40\n"
        "pools:\n"
        "  default:\n"
        "    # How many at once.\n"
        "    # batch_size: 4\n"
        "    lease: 30s\n")
    assert header == ["The header."]
    store, deps, pools = keys
    assert (store.name, store.value, store.comment, store.example) == ("store", "sqlite:///q.db", "The store.", False)
    assert [(k.name, k.example) for k in deps.children] == [("db", True)]
    assert [(k.name, k.value) for k in deps.children[0].children] == [("capacity", "40")]
    default = pools.children[0]
    assert [(k.name, k.comment, k.example) for k in default.children] == [
        ("batch_size", "How many at once.", True), ("lease", "", False)]
