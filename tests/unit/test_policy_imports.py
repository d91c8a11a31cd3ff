"""policy/ is the pure core: it takes plain values, so it never imports the config's loader or
model (flexiqd.config); the config builds the policy's types, not the other way round."""

from __future__ import annotations

import ast
import pathlib

import flexiqd.policy

POLICY = pathlib.Path(flexiqd.policy.__file__).parent


def imported_modules(source: str, package: str) -> set[str]:
    """Every module ``source`` (a module of ``package``) imports, relative imports resolved."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)  # `from .. import config`
    return found


def test_no_policy_module_imports_the_config():
    modules = sorted(POLICY.rglob("*.py"))
    assert modules, f"no modules under {POLICY}"
    offending = {}
    for path in modules:
        package = ".".join(("flexiqd",) + path.relative_to(POLICY.parent).parts[:-1])
        found = sorted(m for m in imported_modules(path.read_text(), package) if is_config(m))
        if found:
            offending[str(path.relative_to(POLICY.parent))] = found
    assert offending == {}


def is_config(module: str) -> bool:
    return module == "flexiqd.config" or module.startswith("flexiqd.config.")


def test_the_check_sees_every_way_of_importing_the_config():
    # The check must be able to fail: the same resolution on sources that do import it.
    for source in ("from ..config.model import PoolConfig\n", "from .. import config\n",
                   "import flexiqd.config\n", "from flexiqd.config import DaemonConfig\n"):
        assert any(is_config(m) for m in imported_modules(source, "flexiqd.policy")), source
    assert not any(is_config(m) for m in imported_modules("from .config import PolicyConfig\n", "flexiqd.policy"))
