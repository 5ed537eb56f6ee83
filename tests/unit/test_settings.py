"""Settings from the environment: defaults, conversions and validation."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from exportcore import settings as settings_module
from exportcore.settings import BULK_QUEUE, FAST_QUEUE, QUEUES, Settings, get_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No settings variable from the outer environment, and no ``.env`` in the cwd."""
    for name in Settings.model_fields:
        monkeypatch.delenv(name.upper(), raising=False)
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_defaults() -> None:
    s = Settings()
    assert s.database_dsn == "postgresql://postgres@127.0.0.1:55432/exports"
    assert s.broker_url == "redis://127.0.0.1:56379/0"
    assert s.lease_seconds == 30.0
    assert s.max_attempts == 3
    assert s.fast_queue_max_notes == 30
    assert s.artifact_dir == Path(".dev/artifacts")
    assert s.broker_visibility_timeout > s.task_time_limit
    assert QUEUES == (FAST_QUEUE, BULK_QUEUE) == ("exports.fast", "exports.bulk")


def test_values_come_from_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://app:pw@db.example:5433/notes")
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://:pw@cache:6379/3")
    monkeypatch.setenv("LEASE_SECONDS", "12.5")
    monkeypatch.setenv("FAST_QUEUE_MAX_NOTES", "100")
    monkeypatch.setenv("ARTIFACT_DIR", "/var/lib/exports")
    monkeypatch.setenv("LOG_LEVEL", "debug")
    s = Settings()
    assert s.database_dsn == "postgresql://app:pw@db.example:5433/notes"
    assert s.broker_url == "redis://:pw@cache:6379/3"
    assert s.lease_seconds == 12.5
    assert s.fast_queue_max_notes == 100
    assert s.artifact_dir == Path("/var/lib/exports")
    assert s.log_level == "debug"


def test_lower_case_variable_names_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("max_attempts", "7")
    assert Settings().max_attempts == 7


def test_dotenv_file_is_read_and_the_environment_wins(
    monkeypatch: pytest.MonkeyPatch, clean_env: Path
) -> None:
    (clean_env / ".env").write_text("MAX_ATTEMPTS=5\nRENDER_CHUNK_SIZE=42\nUNRELATED=x\n")
    monkeypatch.setenv("RENDER_CHUNK_SIZE", "7")
    s = Settings()
    assert s.max_attempts == 5
    assert s.render_chunk_size == 7


@pytest.mark.parametrize(
    ("url", "dsn", "sqlalchemy"),
    [
        (
            "postgresql://u:p@h:5432/db",
            "postgresql://u:p@h:5432/db",
            "postgresql+psycopg://u:p@h:5432/db",
        ),
        (
            "postgresql+psycopg://u:p@h:5432/db",
            "postgresql://u:p@h:5432/db",
            "postgresql+psycopg://u:p@h:5432/db",
        ),
        ("postgres://u@h/db", "postgres://u@h/db", "postgresql+psycopg://u@h/db"),
    ],
)
def test_database_url_conversions(
    monkeypatch: pytest.MonkeyPatch, url: str, dsn: str, sqlalchemy: str
) -> None:
    monkeypatch.setenv("DATABASE_URL", url)
    s = Settings()
    assert s.database_dsn == dsn
    assert s.sqlalchemy_url == sqlalchemy


@pytest.mark.parametrize("scheme", ["postgresql+psycopg2", "postgresql+asyncpg"])
def test_database_dsn_is_always_libpq(monkeypatch: pytest.MonkeyPatch, scheme: str) -> None:
    monkeypatch.setenv("DATABASE_URL", f"{scheme}://u:p@h:5432/db")
    try:
        dsn = Settings().database_dsn
    except pydantic.ValidationError:
        return  # rejecting the scheme at start is fine too
    assert dsn.startswith(("postgresql://", "postgres://"))


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("LEASE_SECONDS", "abc"),
        ("LEASE_SECONDS", "0"),
        ("MAX_ATTEMPTS", "0"),
        ("FAST_QUEUE_MAX_NOTES", "1.5"),
        ("RENDER_CHUNK_SIZE", "-1"),
        ("BROKER_VISIBILITY_TIMEOUT", "10"),
        ("DB_POOL_MAX_SIZE", "0"),
        ("DATABASE_URL", "mysql://u:p@h/db"),
        ("DATABASE_URL", "not a url"),
        ("CELERY_BROKER_URL", "amqp://guest@rabbit//"),
    ],
)
def test_malformed_values_raise_validation_error_naming_the_field(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(pydantic.ValidationError) as info:
        Settings()
    assert [err["loc"] for err in info.value.errors()] == [(name.lower(),)]


def test_settings_are_frozen() -> None:
    s = Settings()
    with pytest.raises(pydantic.ValidationError):
        s.max_attempts = 9  # type: ignore[misc]


def test_get_settings_reads_the_environment_once(monkeypatch: pytest.MonkeyPatch) -> None:
    settings_module.get_settings.cache_clear()
    try:
        monkeypatch.setenv("MAX_ATTEMPTS", "4")
        first = get_settings()
        monkeypatch.setenv("MAX_ATTEMPTS", "8")
        assert get_settings() is first
        assert first.max_attempts == 4
    finally:
        settings_module.get_settings.cache_clear()


@pytest.mark.parametrize(("visibility", "ok"), [(3059, False), (3060, True)])
def test_visibility_timeout_must_exceed_the_task_limit_by_a_minute(
    monkeypatch: pytest.MonkeyPatch, visibility: int, ok: bool
) -> None:
    monkeypatch.setenv("TASK_TIME_LIMIT", "3000")
    monkeypatch.setenv("BROKER_VISIBILITY_TIMEOUT", str(visibility))
    if ok:
        assert Settings().broker_visibility_timeout == visibility
    else:
        with pytest.raises(pydantic.ValidationError, match="BROKER_VISIBILITY_TIMEOUT"):
            Settings()
