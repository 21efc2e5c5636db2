"""defaults < config file < RELAY_* environment < command line."""
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
