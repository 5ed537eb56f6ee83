"""Settings from the environment: defaults, conversions and validation."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from exportcore import settings as settings_module
from exportcore.domain import BULK_QUEUE, FAST_QUEUE, QUEUES
from exportcore.settings import Settings, get_settings


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
        # artifact storage
        ("ARTIFACT_URL", "s3://Not_A_Bucket"),
        ("ARTIFACT_URL", "s3://user:secret@bucket"),
        ("ARTIFACT_URL", "ftp://host/x"),
        ("S3_ENDPOINT_URL", "minio:9000"),
        ("S3_ENDPOINT_URL", "http://key:secret@minio:9000"),
        ("S3_PRESIGN_ENDPOINT_URL", "files.example.com"),
        ("S3_ADDRESSING_STYLE", "dns"),
        ("S3_MULTIPART_PART_SIZE", str(5 * 1024 * 1024 - 1)),
        ("S3_MULTIPART_THRESHOLD", "-1"),
        ("DOWNLOAD_MODE", "proxy"),
        ("PRESIGN_SECONDS", "0"),
        ("PRESIGN_SECONDS", "604801"),
        ("S3_MAX_ATTEMPTS", "0"),
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


# --- artifact storage -------------------------------------------------------------------------


def test_artifact_storage_defaults() -> None:
    s = Settings()
    assert s.artifact_url == ""
    loc = s.artifact_location()
    assert (loc.scheme, loc.path) == ("file", Path(".dev/artifacts"))
    assert (s.download_mode, s.presign_seconds) == ("stream", 300)
    assert (s.s3_endpoint_url, s.s3_region, s.s3_access_key_id) == ("", "", "")
    assert s.s3_secret_access_key is None
    assert s.s3_addressing_style == "auto"
    assert s.s3_multipart_threshold == s.s3_multipart_part_size == 8 * 1024 * 1024


def test_artifact_url_wins_over_artifact_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARTIFACT_DIR", "/var/lib/old")
    assert Settings().artifact_location().path == Path("/var/lib/old")
    monkeypatch.setenv("ARTIFACT_URL", "s3://exports-prod/tenants")
    loc = Settings().artifact_location()
    assert (loc.scheme, loc.bucket, loc.prefix) == ("s3", "exports-prod", "tenants")
    monkeypatch.setenv("ARTIFACT_URL", "file:///srv/exports")
    assert Settings().artifact_location().path == Path("/srv/exports")


def test_s3_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "ARTIFACT_URL": "s3://exports-prod",
        "S3_ENDPOINT_URL": "http://minio.storage.svc:9000/",
        "S3_PRESIGN_ENDPOINT_URL": "https://files.example.com",
        "S3_REGION": "eu-central-1",
        "S3_ACCESS_KEY_ID": "AKIAEXAMPLE",
        "S3_SECRET_ACCESS_KEY": "wJalrXUtnFEMI",
        "S3_ADDRESSING_STYLE": "path",
        "S3_MULTIPART_THRESHOLD": "0",
        "S3_MULTIPART_PART_SIZE": str(16 * 1024 * 1024),
        "DOWNLOAD_MODE": "redirect",
        "PRESIGN_SECONDS": "60",
    }.items():
        monkeypatch.setenv(name, value)
    s = Settings()
    assert s.s3_endpoint_url == "http://minio.storage.svc:9000"
    assert s.s3_presign_endpoint_url == "https://files.example.com"
    assert s.s3_secret_access_key is not None
    assert s.s3_secret_access_key.get_secret_value() == "wJalrXUtnFEMI"
    assert "wJalrXUtnFEMI" not in repr(s) and "wJalrXUtnFEMI" not in str(s.model_dump())
    assert (s.s3_multipart_threshold, s.s3_multipart_part_size) == (0, 16 * 1024 * 1024)
    assert (s.download_mode, s.presign_seconds, s.s3_addressing_style) == (
        "redirect",
        60,
        "path",
    )


@pytest.mark.parametrize("given", ["S3_ACCESS_KEY_ID", "S3_SECRET_ACCESS_KEY"])
def test_s3_credentials_come_in_pairs(monkeypatch: pytest.MonkeyPatch, given: str) -> None:
    monkeypatch.setenv(given, "only-this-one")
    with pytest.raises(pydantic.ValidationError, match="both") as info:
        Settings()
    assert "only-this-one" not in str(info.value)


def test_an_empty_secret_means_no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("S3_SECRET_ACCESS_KEY", "")
    assert Settings().s3_secret_access_key is None


def test_validation_errors_never_echo_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://app:hunter2@db/x")
    monkeypatch.setenv("LEASE_SECONDS", "abc")
    with pytest.raises(pydantic.ValidationError) as info:
        Settings()
    assert "hunter2" not in str(info.value)


def test_a_multi_host_database_url_is_kept_for_libpq() -> None:
    url = "postgresql://u:p@db-0:5432,db-1:5432/exports?target_session_attrs=read-write"
    s = Settings(database_url=url)
    assert s.database_dsn == url
    assert s.session_dsn == url  # no direct URL: the same


def test_a_transaction_pooler_needs_the_direct_url() -> None:
    with pytest.raises(pydantic.ValidationError, match="DATABASE_DIRECT_URL"):
        Settings(database_url="postgresql://u@bouncer:6432/exports", database_pooler="transaction")
    s = Settings(
        database_url="postgresql://u@bouncer:6432/exports",
        database_pooler="transaction",
        database_direct_url="postgresql+psycopg://u@db:5432/exports",
    )
    assert s.session_dsn == "postgresql://u@db:5432/exports"
    assert s.database_dsn == "postgresql://u@bouncer:6432/exports"


def test_an_empty_direct_url_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_DIRECT_URL", "")
    monkeypatch.setenv("BROKER_TLS_CA_FILE", "")
    s = Settings()
    assert s.database_direct_url is None and s.broker_tls_ca_file is None
