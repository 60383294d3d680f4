"""Settings: defaults, parsing from the environment, and errors that name the variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from poller import ConfigurationError, load_settings
from poller.settings import DEFAULT_RETRY_SCHEDULE


def test_defaults_are_valid() -> None:
    settings = load_settings()
    assert settings.retry_schedule == DEFAULT_RETRY_SCHEDULE
    assert settings.max_attempts == 10 and settings.notify is True
    assert settings.claim_lease >= 2 * settings.request_timeout + 1


def test_environment_is_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLLER_RETRY_SCHEDULE", "[0.1, 0.5, 2]")
    monkeypatch.setenv("POLLER_NOTIFY", "off")
    monkeypatch.setenv("POLLER_REQUEST_TIMEOUT", "0.25")
    monkeypatch.setenv("POLLER_CLAIM_LEASE", "1.5")
    monkeypatch.setenv("POLLER_METRICS_ADDR", "127.0.0.1:9108")
    settings = load_settings()
    assert settings.retry_schedule == (0.1, 0.5, 2.0)
    assert settings.notify is False
    assert (settings.request_timeout, settings.claim_lease) == (0.25, 1.5)
    assert settings.metrics_addr == "127.0.0.1:9108"


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("POLLER_SHARDS", "0"),
        ("POLLER_SHARDS", "many"),
        ("POLLER_BATCH_SIZE", "-1"),
        ("POLLER_CONCURRENCY", "0"),
        ("POLLER_POLL_INTERVAL", "0"),
        ("POLLER_REQUEST_TIMEOUT", "-5"),
        ("POLLER_RETRY_SCHEDULE", "[]"),
        ("POLLER_RETRY_SCHEDULE", "[5, -1]"),
        ("POLLER_RETRY_SCHEDULE", "5 minutes"),
        ("POLLER_MAX_ATTEMPTS", "0"),
        ("POLLER_ELECTION", "zookeeper"),
        ("POLLER_ELECTION_FAIL", "maybe"),
        ("POLLER_METRICS_ADDR", "9108"),
        ("POLLER_METRICS_ADDR", "localhost:99999"),
        ("POLLER_LOG_FORMAT", "xml"),
        ("POLLER_NOTIFY", "perhaps"),
        ("POLLER_CLAIM_LEASE", "5"),
        ("POLLER_CLAIM_LEASE", "inf"),
        ("POLLER_CLAIM_LEASE", "nan"),
        ("POLLER_REQUEST_TIMEOUT", "NaN"),
        ("POLLER_RETENTION_DELIVERED", "1e300"),
        ("POLLER_RETRY_SCHEDULE", "[5, 1e12]"),
        ("POLLER_RETRY_SCHEDULE", "[Infinity]"),
        ("POLLER_RETRY_AFTER_MAX", "inf"),
        ("POLLER_SHUTDOWN_GRACE", "inf"),
        ("POLLER_CONNECT_TIMEOUT", "0"),
        ("POLLER_SWEEP_INTERVAL", "1e-300"),  # a sweep loop flat out against the database
        ("POLLER_POLL_INTERVAL", "0.001"),
        ("POLLER_REQUEST_TIMEOUT", "1e-300"),  # every request timed out
        ("POLLER_RETRY_SCHEDULE", "[" + ",".join(["1"] * 51) + "]"),  # as an endpoint's: 50
        ("POLLER_PERMANENT_STATUSES", "[99]"),
        ("POLLER_CIRCUIT_FAILURES", "-1"),
        ("POLLER_CIRCUIT_FAILURES", "ten"),
        ("POLLER_CIRCUIT_COOLDOWN", "0"),
        ("POLLER_CIRCUIT_COOLDOWN", "nan"),
        ("POLLER_CIRCUIT_COOLDOWN_MAX", "inf"),
        ("POLLER_CIRCUIT_COOLDOWN", "5e-324"),  # a failing endpoint probed 10/s for minutes
        ("POLLER_TENANT_MAX_ENDPOINTS", "-1"),
        ("POLLER_TENANT_MAX_ENDPOINTS", "2.5"),
        ("POLLER_DISABLE_AFTER", "-1"),
        ("POLLER_DISABLE_AFTER", "NaN"),
        ("POLLER_OPERATOR_ENDPOINT", "ops; DROP TABLE x"),
        ("POLLER_OPERATOR_ENDPOINT", "-ops"),
    ],
)
def test_invalid_value_names_its_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError, match=variable):
        load_settings()


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("POLLER_RETRY_SCHEDULE", "5 minutes", r"not valid JSON \(e\.g\. \[5, 300, 1800\]\)"),
        ("POLLER_RETRY_SCHEDULE", "5", r"=5: not a JSON list \(e\.g\. \[5, 300"),
        ("POLLER_PERMANENT_STATUSES", "400,422", r"not valid JSON \(e\.g\. \[400, 422\]\)"),
        ("POLLER_PERMANENT_STATUSES", '{"a": 1}', r"not a JSON list \(e\.g\. \[400, 422\]\)"),
        ("POLLER_PORTAL_EMBED_ORIGINS", "https://a.example", r'e\.g\. \["https://app'),
    ],
)
def test_a_list_setting_that_is_not_a_json_list_shows_its_own_example(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, said: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError, match=f"^{variable}.*{said}"):
        load_settings()


def test_a_framed_portal_must_be_served_over_https() -> None:
    """Its cookie is SameSite=None; Secure: over http a browser keeps none."""
    framed = {"portal_embed_origins": ("https://app.example.com",)}
    for where in ({"portal_url": "http://hooks.example.com"}, {"dashboard_addr": "0.0.0.0:8188"}):
        with pytest.raises(ConfigurationError, match="needs the portal on https"):
            load_settings(**framed, **where)
    for where in ({"portal_url": "https://hooks.example.com"}, {"portal_url": "http://[::1]:81"},
                  {"portal_url": "http://localhost:8188"}, {}):  # fmt: skip
        assert load_settings(**framed, **where).portal_embed_origins
    assert load_settings(portal_url="http://hooks.example.com").portal_url  # not framed: fine


def test_the_circuit_cool_down_cap_is_not_below_the_cool_down() -> None:
    with pytest.raises(ConfigurationError, match="POLLER_CIRCUIT_COOLDOWN_MAX=10: must be at"):
        load_settings(circuit_cooldown=60, circuit_cooldown_max=10)
    assert load_settings(operator_endpoint="").operator_endpoint is None


def test_claim_lease_must_cover_a_lookup_and_a_send() -> None:
    with pytest.raises(ConfigurationError, match="POLLER_CLAIM_LEASE=20: must be at least"):
        load_settings(request_timeout=10, claim_lease=20)
    assert load_settings(request_timeout=10, claim_lease=21).claim_lease == 21


def test_lease_ttl_has_a_floor() -> None:
    with pytest.raises(ConfigurationError, match="POLLER_LEASE_TTL"):
        load_settings(lease_ttl=0.1)


def test_a_dot_env_that_is_not_utf8_is_one_configuration_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / ".env").write_bytes(b"POLLER_SHARDS=\xff\xfe\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigurationError, match=r"\.env in .*: not UTF-8 text \(byte 0xff"):
        load_settings()


def test_the_database_shown_to_people_hides_every_password() -> None:
    from poller.cli.common import where

    url = "postgresql://u:pw1@h/db?password=pw2&SSLPASSWORD=pw3&application_name=app"
    shown = where(load_settings(database_url=url), url)
    assert not any(secret in shown for secret in ("pw1", "pw2", "pw3"))
    assert shown.startswith("postgresql://u:***@h/db?") and "application_name=app" in shown


def test_open_files_short_of_the_waiting_deliveries_lower_them_and_say_so() -> None:
    """A hard limit of 600 open files cannot hold 2,064 sockets: fewer may wait."""
    import resource
    import subprocess
    import sys

    script = (
        "import logging; logging.basicConfig(level='WARNING');"
        "from poller.cli.run import _open_files_for;"
        "from poller.settings import load_settings;"
        "print(_open_files_for(load_settings()).max_waiting)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (600, 600)),
    )
    assert done.stdout.strip() == "280"
    assert "at most 280 deliveries wait" in done.stderr
