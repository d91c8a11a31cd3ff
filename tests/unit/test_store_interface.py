"""``Backend`` is the store's interface and ``Store`` its one implementation: every member
the interface names is the store's, with the same parameters, so a caller holding a
``Backend`` never reaches a method that is not there."""

from __future__ import annotations

import inspect

from flexiqd.queue import Backend
from flexiqd.queue.store.lifecycle import Store


def _members(cls: type) -> dict[str, object]:
    return {name: value for name, value in vars(cls).items() if not name.startswith("_")}


def _parameters(function) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def test_the_store_has_every_method_of_the_interface_with_its_parameters():
    store = _members(Store)
    methods = {name: value for name, value in _members(Backend).items() if inspect.isfunction(value)}
    assert len(methods) > 40  # the interface's methods were read, not an empty class
    missing = sorted(name for name in methods if not inspect.isfunction(store.get(name)))
    assert not missing, f"Backend methods Store does not implement: {missing}"
    differ = sorted(name for name, method in methods.items() if _parameters(method) != _parameters(store[name]))
    assert not differ, f"Store's parameters differ from Backend's in: {differ}"


def test_the_store_has_every_attribute_of_the_interface():
    attributes = set(inspect.get_annotations(Backend))
    assert {"url", "shared_by_hosts", "schema_versions"} <= attributes
    # ``url`` is set on each instance, from its database: the rest are the class's.
    missing = sorted(name for name in attributes - {"url"} if name not in _members(Store))
    assert not missing, f"Backend attributes Store does not have: {missing}"


def test_an_open_store_has_its_url(tmp_path):
    from flexiqd.queue.sqlite.database import SQLiteBackend

    store = SQLiteBackend(str(tmp_path / "q.db"))
    try:
        assert store.url.endswith("q.db")
    finally:
        store.close()


def test_the_interface_is_a_protocol_the_store_does_not_inherit_from():
    assert getattr(Backend, "_is_protocol", False)
    assert Backend not in Store.__mro__  # nothing of the interface runs in the store
