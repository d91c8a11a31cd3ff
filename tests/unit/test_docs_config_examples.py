"""Every flexiqd.yaml example in the README and docs/ loads as the daemon would load it.

A ```yaml block whose top-level keys are all flexiqd.yaml's is a whole config: it must pass
the loader (``parse_config``, what ``flexiqd --check-config`` runs first).  A block with
none of them is another program's file (a Kubernetes manifest, a Prometheus job).  A block
mixing both is neither, and fails: an example a reader cannot paste as it stands.
"""

from __future__ import annotations

import pathlib
import re

import pytest
import yaml

from flexiqd.config.load import parse_config
from flexiqd.errors import ConfigError
from flexiqd.settings_schema import SETTINGS

REPO = pathlib.Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
CONFIG_KEYS = frozenset(setting.key.split(".")[0] for setting in SETTINGS)
YAML_BLOCK = re.compile(r"^```yaml[ \t]*\n(.*?)^```", re.S | re.M)


def yaml_examples() -> list[tuple[str, str]]:
    """(page:line, text) of every ```yaml block of the README and docs/."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in YAML_BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 2
            found.append((f"{page.relative_to(REPO)}:{line}", match.group(1)))
    return found


EXAMPLES = yaml_examples()


def test_the_docs_have_config_examples():
    whole = [text for _, text in EXAMPLES if _top_keys(text) and _top_keys(text) <= CONFIG_KEYS]
    assert len(whole) >= 10, "the search for examples found too few: has the fence changed?"


@pytest.mark.parametrize("where, text", EXAMPLES, ids=[where for where, _ in EXAMPLES])
def test_every_config_example_loads(where, text):
    keys = _top_keys(text)
    if not keys & CONFIG_KEYS:
        return  # another program's file
    assert keys <= CONFIG_KEYS, f"{where}: mixes flexiqd.yaml's keys with others: {sorted(keys - CONFIG_KEYS)}"
    try:
        parse_config(text, where)
    except ConfigError as exc:
        pytest.fail(f"the loader refuses the example: {exc}")


def _top_keys(text: str) -> set[str]:
    keys: set[str] = set()
    for document in yaml.safe_load_all(text):
        if isinstance(document, dict):
            keys.update(str(key) for key in document)
    return keys
