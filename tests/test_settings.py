"""defaults < config file < RELAY_* environment < command line."""
import dataclasses

import pytest

import settings


def test_defaults():
    s = settings.load([], {})
    assert s.port == 3000 and s.data_dir == "./data" and s.mongo_url == ""


def test_precedence(tmp_path):
    cfg = tmp_path / "relay.toml"
    cfg.write_text('port = 4000\ndata_dir = "/from/file"\nmax_body_mb = 10\n')
    s = settings.load(["--config", str(cfg)], {})
    assert (s.port, s.data_dir, s.max_body_mb) == (4000, "/from/file", 10)
    s = settings.load(["--config", str(cfg)], {"RELAY_PORT": "5000", "RELAY_MONGO_URL": "mongodb://x"})
    assert (s.port, s.data_dir, s.mongo_url) == (5000, "/from/file", "mongodb://x")
    s = settings.load(["--config", str(cfg), "--port", "6000"], {"RELAY_PORT": "5000"})
    assert s.port == 6000


def test_config_from_environment(tmp_path):
    cfg = tmp_path / "relay.toml"
    cfg.write_text("retries = 5\n")
    assert settings.load([], {"RELAY_CONFIG": str(cfg)}).retries == 5


def test_types_are_coerced():
    s = settings.load(["--secure-cookies", "true", "--first-byte-timeout", "2.5"], {})
    assert s.secure_cookies is True and s.first_byte_timeout == 2.5


def test_unknown_key_in_file_is_refused(tmp_path):
    cfg = tmp_path / "relay.toml"
    cfg.write_text("prot = 1\n")
    with pytest.raises(SystemExit):
        settings.load(["--config", str(cfg)], {})


def test_settings_are_frozen():
    s = settings.load([], {})
    with pytest.raises(Exception):
        s.port = 1


def test_every_setting_has_a_description_from_its_comment():
    helps = settings.describe()
    names = [f.name for f in dataclasses.fields(settings.Settings)]
    assert sorted(helps) == sorted(names)
    assert [n for n in names if len(helps[n]) < 15] == []
    # The text is the comment block right above the field, joined.
    assert helps["port"] == "TCP port the relay listens on."
    assert helps["secret"].startswith("Server secret for key encryption") \
        and "\n" not in helps["secret"] and "#" not in helps["secret"]


def test_help_lists_every_setting_with_its_description_and_the_commands(capsys):
    with pytest.raises(SystemExit) as exit_:
        settings.parse(["--help"], {}, actions={"reset_admin_password": "Give root a new one."})
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    text = "".join(out.split())  # argparse wraps lines, also at hyphens
    for name, help_ in settings.describe().items():
        flag = "--" + name.replace("_", "-")
        assert f"  {flag} " in out
        assert "".join(help_.split()) in text, name
    assert "--reset-admin-passwordGiverootanewone." in text
    assert "(default:3000)" in text


def test_actions_are_reported_apart_from_the_settings():
    s, actions = settings.parse(["--port", "4001", "--reset-admin-password"], {},
                                actions={"reset_admin_password": "x"})
    assert s.port == 4001 and actions == {"reset_admin_password": True}
    assert settings.parse([], {}, actions={"reset_admin_password": "x"})[1] == {
        "reset_admin_password": False}
