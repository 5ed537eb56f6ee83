# syntax=docker/dockerfile:1
# One image for all six processes (api, publisher, recovery-scanner, beat, fast/bulk
# workers); the Helm chart picks the process with the container args.
#
#   docker build -t notes-exports:$(git describe --always --dirty) .     (or: make image)
#
# - build stage: a virtualenv with exportcore and the runtime dependencies (ranges from the
#   pyproject files), byte-compiled; nothing of it but /opt/venv reaches the final stage.
# - final stage: slim Python, tini as PID 1 (forwards TERM to gunicorn / Celery / the loops,
#   reaps zombies), a non-root user with a fixed UID/GID 10001, a read-only root filesystem:
#   the only writable paths are the volumes the chart mounts (artifacts, /run/notes-exports
#   for heartbeats, metrics and the beat schedule, and /tmp).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# Dependencies first (cached until a pyproject changes).
COPY pyproject.toml ./
COPY libs/exportcore/pyproject.toml libs/exportcore/pyproject.toml
# exportcore is installed from the source below; honcho only runs the local Procfile.
RUN python -m pip install --upgrade pip \
 && python -c 'import tomllib; deps = [d for p in ("libs/exportcore/pyproject.toml", "pyproject.toml") for d in tomllib.load(open(p, "rb"))["project"]["dependencies"]]; print("\n".join(d for d in deps if not d.startswith(("exportcore", "honcho"))))' \
      > /tmp/requirements.txt
RUN python -m pip install -r /tmp/requirements.txt
COPY libs/exportcore libs/exportcore
RUN python -m pip install --no-deps ./libs/exportcore \
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
