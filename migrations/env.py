"""Alembic environment: the URL comes from the shared settings chain (DATABASE_URL)."""

from __future__ import annotations

from logging.config import fileConfig

import psycopg
from alembic import context
from sqlalchemy import create_engine, pool

from exportcore.settings import Settings

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def _settings() -> Settings:
    # An explicit URL (tests, `exportctl migrate --database-url`) wins over the environment.
    explicit = config.attributes.get("database_url")
    return Settings(database_url=explicit) if explicit else Settings()


def run_migrations_offline() -> None:
    context.configure(url=_settings().sqlalchemy_url, target_metadata=None, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    # A session of its own (DATABASE_DIRECT_URL behind a transaction pooler), opened by
    # libpq from the URL itself: a multi-host URL (several primaries' candidates,
    # target_session_attrs=read-write) is libpq syntax that SQLAlchemy's URL parser refuses.
    settings = _settings()
    engine = create_engine(
        "postgresql+psycopg://",
        creator=lambda: psycopg.connect(settings.session_dsn),
        poolclass=pool.NullPool,
    )
    with engine.connect() as connection:
        context.configure(
            connection=connection, target_metadata=None, transaction_per_migration=True
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
