# syntax=docker/dockerfile:1
# One image for all seven processes (api, publisher, recovery-scanner, beat, fast/bulk
# workers, webhook-delivery); the Helm chart picks the process with the container args.
#
#   docker build -t notes-exports:$(git describe --always --dirty) .     (or: make image)
#
# - build stage: a virtualenv with the locked runtime dependencies (requirements.lock, every
#   file checked against its sha256: --require-hashes), then exportcore (the library the
#   processes share) and exportctl (the operators' command line: `kubectl exec ... exportctl`,
#   the chart's migration hook) from their paths with --no-deps and --no-build-isolation
#   (setuptools comes from the lock too), byte-compiled; nothing of it but /opt/venv reaches
#   the final stage. devtools/, bench/ and tests/ never enter the image (.dockerignore).
# - final stage: slim Python, tini as PID 1 (forwards TERM to gunicorn / Celery / the loops,
#   reaps zombies), a non-root user with a fixed UID/GID 10001, a read-only root filesystem:
#   the only writable paths are the volumes the chart mounts (artifacts, /run/notes-exports
#   for heartbeats, metrics and the beat schedule, and /tmp).
#
# PYTHON_IMAGE: any Python 3.11 image with `python -m venv` (a local base works:
# `buildah bud --build-arg PYTHON_IMAGE=localhost/base .`). Pin it by digest
# (`name:tag@sha256:...`) with `make pin-base-image` where the registry is reachable;
# docs/development.md "Base image".

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# Dependencies first (cached until the lock changes).
COPY requirements.lock ./
RUN python -m pip install --require-hashes --no-deps -r requirements.lock
COPY libs/exportcore libs/exportcore
COPY libs/exportctl libs/exportctl
RUN python -m pip install --no-deps --no-build-isolation ./libs/exportcore ./libs/exportctl \
 && python -m pip check \
 && python -m compileall -q /opt/venv/lib

FROM ${PYTHON_IMAGE} AS runtime
ARG APP_UID=10001
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid ${APP_UID} app \
 && useradd --system --uid ${APP_UID} --gid app --home-dir /app --no-create-home \
      --shell /usr/sbin/nologin app \
 && mkdir -p /var/lib/notes-exports/artifacts /run/notes-exports \
 && chown -R ${APP_UID}:${APP_UID} /var/lib/notes-exports /run/notes-exports
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
# The processes' entrypoints, Alembic and the migrations: the working directory of every
# command (gunicorn -c services/api/gunicorn_conf.py, exportctl migrate).
COPY --chown=root:root alembic.ini Procfile ./
COPY --chown=root:root migrations migrations
COPY --chown=root:root services services
RUN python -m compileall -q /app/services /app/migrations
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/app \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    ARTIFACT_DIR=/var/lib/notes-exports/artifacts \
    API_BIND=0.0.0.0:8000
USER ${APP_UID}:${APP_UID}
EXPOSE 8000
VOLUME ["/var/lib/notes-exports/artifacts", "/run/notes-exports"]
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["gunicorn", "-c", "services/api/gunicorn_conf.py", "services.api.app:app"]
