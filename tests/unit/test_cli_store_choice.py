"""The ``flexiq`` queue commands use the daemon's store: ``--url``, ``$FLEXIQ_URL``, the config's
``store:``, the packaged default -- and say so on stderr when it is not the default."""

from __future__ import annotations

import json
import os

import pytest

from flexiqd.cli.flexiq import main
from flexiqd.cli.store_choice import ConfigText, choose_store, read_config_text, store_for_command
from flexiqd.errors import FlexiqdError
from flexiqd.queue import open_backend
from flexiqd.queue.url import DEFAULT_URL

CONFIG = "/etc/flexiqd/flexiqd.yaml"
PG = "postgresql://flexiq:hunter2@db.example/flexiq"
POOLS = "pools:\n  default:\n    app: tasks:queue\n"


def config(text: str | None = None, unreadable: str | None = None) -> ConfigText:
    return ConfigText(CONFIG, text=text, unreadable=unreadable)


# -- the choice, pure --------------------------------------------------------------------------------

def test_the_configs_store_is_used_and_named_with_its_password_hidden():
    choice = choose_store(None, {}, config(f"store: {PG}\n{POOLS}"))
    assert (choice.url, choice.source) == (PG, CONFIG)
    assert choice.note == f"using the store postgresql://flexiq:***@db.example/flexiq (from {CONFIG})"
    assert "hunter2" not in choice.note


@pytest.mark.parametrize("given, environ, expected", [
    ("sqlite:////tmp/given.db", {"FLEXIQ_URL": "sqlite:////tmp/env.db"}, ("sqlite:////tmp/given.db", "--url")),
    (None, {"FLEXIQ_URL": "sqlite:////tmp/env.db"}, ("sqlite:////tmp/env.db", "$FLEXIQ_URL")),
])
def test_the_command_line_and_the_environment_come_before_the_config(given, environ, expected):
    choice = choose_store(given, environ, config(f"store: {PG}\n"))
    assert (choice.url, choice.source) == expected


def test_a_url_typed_on_the_command_line_is_not_repeated_back():
    assert choose_store(PG, {}, config()).note is None


def test_a_store_from_the_environment_is_named():
    choice = choose_store(None, {"FLEXIQ_URL": PG}, config())
    assert choice.note == "using the store postgresql://flexiq:***@db.example/flexiq (from $FLEXIQ_URL)"


@pytest.mark.parametrize("text", [None, POOLS, f"store: {DEFAULT_URL}\n{POOLS}", ""])
def test_no_file_no_store_or_the_default_store_is_the_default_silently(text):
    choice = choose_store(None, {}, config(text))
    assert (choice.url, choice.note) == (DEFAULT_URL, None)


def test_an_unreadable_config_falls_back_to_the_default_and_says_why():
    choice = choose_store(None, {}, config(unreadable="permission denied"))
    assert choice.url == DEFAULT_URL
    assert choice.note.startswith(f"cannot read {CONFIG} (permission denied); using the default store {DEFAULT_URL}")


def test_a_config_that_is_not_yaml_falls_back_to_the_default_and_names_the_line():
    choice = choose_store(None, {}, config(f"store: {PG}\npools: [\n"))
    assert choice.url == DEFAULT_URL
    assert choice.note.startswith(f"cannot parse {CONFIG} (line ") and DEFAULT_URL in choice.note


@pytest.mark.parametrize("store", ["[1, 2]", "''", "42"])
def test_a_store_that_is_not_a_url_is_an_error_not_a_guess(store):
    with pytest.raises(FlexiqdError, match=f"^{CONFIG}: store: must be a store URL"):
        choose_store(None, {}, config(f"store: {store}\n"))


def test_only_the_store_key_is_read_so_a_bad_pool_does_not_hide_the_queue():
    choice = choose_store(None, {}, config(f"store: {PG}\npools:\n  default:\n    concurency: 2\n"))
    assert choice.url == PG


# -- reading the file -----------------------------------------------------------------------------

def test_reading_the_config_file(tmp_path):
    path = tmp_path / "flexiqd.yaml"
    assert read_config_text(str(path)) == ConfigText(str(path))  # no file
    path.write_text(f"store: {PG}\n")
    assert read_config_text(str(path)).text == f"store: {PG}\n"
    assert read_config_text(str(tmp_path)).unreadable == "it is a directory"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_a_file_without_read_permission_is_unreadable(tmp_path):
    path = tmp_path / "flexiqd.yaml"
    path.write_text(f"store: {PG}\n")
    path.chmod(0)
    assert read_config_text(str(path)).unreadable == "permission denied"


def test_the_config_file_comes_from_flexiqd_config(tmp_path):
    path = tmp_path / "elsewhere.yaml"
    path.write_text("store: sqlite:////srv/queue.db\n")
    choice = store_for_command(None, {"FLEXIQD_CONFIG": str(path)})
    assert (choice.url, choice.source) == ("sqlite:////srv/queue.db", str(path))


# -- the commands ---------------------------------------------------------------------------------

@pytest.fixture
def daemon_config(tmp_path, monkeypatch):
    """A config file whose store is a file in tmp_path, found through $FLEXIQD_CONFIG."""
    url = f"sqlite:///{tmp_path / 'moved.db'}"
    path = tmp_path / "flexiqd.yaml"
    path.write_text(f"store: {url}\n{POOLS}")
    monkeypatch.setenv("FLEXIQD_CONFIG", str(path))
    monkeypatch.delenv("FLEXIQ_URL", raising=False)
    return url, str(path)


def test_enqueue_stats_jobs_and_dead_letter_use_the_configs_store(daemon_config, capsys):
    url, path = daemon_config
    assert main(["enqueue", "mail.send", '"a@example.com"', "--queue", "mail", "--count", "2"]) == 0
    # The first line says which store; the next that no worker declared mail.send there.
    assert capsys.readouterr().err.splitlines()[0] == f"flexiq: using the store {url} (from {path})"
    backend = open_backend(url)
    try:
        assert [job.task for job in backend.list_jobs(queue="mail")] == ["mail.send", "mail.send"]
    finally:
        backend.close()
    for argv in (["stats", "--json"], ["jobs", "list", "--json"], ["dead-letter", "list", "--json"]):
        assert main(argv) == 0
        out = capsys.readouterr()
        assert out.err.strip() == f"flexiq: using the store {url} (from {path})", argv
        shown = json.loads(out.out)
        if argv[0] == "stats":
            assert shown["mail"]["runnable"] == 2
        elif argv[0] == "jobs":
            assert len(shown) == 2
        else:
            assert shown == []


def test_url_overrides_the_config_silently(daemon_config, tmp_path, capsys):
    other = f"sqlite:///{tmp_path / 'other.db'}"
    assert main(["--url", other, "enqueue", "count"]) == 0
    assert "using the store" not in capsys.readouterr().err
    assert main(["--url", other, "stats", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["default"]["runnable"] == 1
    assert main(["stats", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["default"]["runnable"] == 0  # the config's store: untouched


def test_a_bad_store_in_the_config_is_one_line_on_stderr(tmp_path, monkeypatch, capsys):
    path = tmp_path / "flexiqd.yaml"
    path.write_text("store: [oops]\n")
    monkeypatch.setenv("FLEXIQD_CONFIG", str(path))
    monkeypatch.delenv("FLEXIQ_URL", raising=False)
    assert main(["stats"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"flexiq: {path}: store: must be a store URL") and len(err.splitlines()) == 1


def test_a_configs_store_that_cannot_be_opened_says_where_it_came_from_and_how_else(tmp_path, monkeypatch,
                                                                                   capsys):
    # The daemon reaches it with a systemd credential; a shell has none.
    path = tmp_path / "flexiqd.yaml"
    path.write_text("store: postgresql://flexiq@db.example/flexiq?password_credential=flexiq-db\n")
    monkeypatch.setenv("FLEXIQD_CONFIG", str(path))
    monkeypatch.delenv("FLEXIQ_URL", raising=False)
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    assert main(["stats"]) == 1
    note, error = capsys.readouterr().err.splitlines()
    assert note == f"flexiq: using the store postgresql://flexiq@db.example/flexiq?password_credential=flexiq-db " \
                   f"(from {path})"
    assert "$CREDENTIALS_DIRECTORY is not set" in error
    assert error.endswith(f"(the store of {path}; give --url, or $FLEXIQ_URL, to reach it another way, "
                          f"e.g. with a password_file or ~/.pgpass you can read)")


def test_a_url_that_cannot_be_opened_gets_no_hint(tmp_path, capsys):
    assert main(["--url", f"sqlite:///{tmp_path / 'missing' / 'queue.db'}", "stats"]) == 1
    error = capsys.readouterr().err
    assert "does not exist" in error and "give --url" not in error
