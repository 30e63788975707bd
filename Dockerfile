# syntax=docker/dockerfile:1.7
# effect-ledger container image.
#
# Two stages: the builder has compilers and pip and produces a self-contained virtual
# environment in /opt/venv; the runtime stage copies only that venv (the migrations are inside
# the package, effect_ledger/migrations) and schema/ for reference. The runtime stage has no
# compiler, no build headers and no pip cache.
#
# Base images are pinned to a patch release. Release CI should additionally pin them by
# digest (python:3.11.11-slim-bookworm@sha256:...) and let Renovate/Dependabot bump it.

FROM python:3.11.11-slim-bookworm AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

# Build tools only for dependencies that ship no wheel for this platform.
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*

RUN python -m venv /opt/venv
ENV PATH="/opt/venv/bin:${PATH}"

WORKDIR /src
# Metadata first so the dependency layer is reused while only sources change.
COPY pyproject.toml README.md ./
COPY service/ service/
# service/effect_ledger/migrations is a link to ../../alembic: the wheel takes the migrations from it.
COPY alembic/ alembic/
# No extras: no embedded PostgreSQL (the image always has EFFECT_LEDGER_DATABASE_URL); granian, and
# serve's own HTTP server (httptools) as the alternative (uvicorn is the extra effect-ledger[uvicorn]).
RUN pip install --no-cache-dir . \
    && pip uninstall -y pip setuptools wheel

FROM python:3.11.11-slim-bookworm AS runtime

ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown

LABEL org.opencontainers.image.title="effect-ledger" \
      org.opencontainers.image.description="A ledger that makes side effects of agents and tool executors safe to retry." \
      org.opencontainers.image.source="https://github.com/effect-ledger/effect-ledger" \
      org.opencontainers.image.url="https://github.com/effect-ledger/effect-ledger" \
      org.opencontainers.image.documentation="https://github.com/effect-ledger/effect-ledger/blob/main/docs/operating-k8s.md" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="effect-ledger" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.base.name="docker.io/library/python:3.11.11-slim-bookworm"

# A fixed numeric UID/GID so Kubernetes can check runAsNonRoot without resolving names.
RUN groupadd --system --gid 10001 effect-ledger \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin effect-ledger

COPY --from=builder /opt/venv /opt/venv

WORKDIR /app
# Nothing else is read at run time: `effect-ledger migrate` finds its migrations in the installed
# package and builds the Alembic config in code. schema/ (the DDL and the OpenAPI document) is
# there for an operator reading the image.
COPY schema/ schema/

ENV PATH="/opt/venv/bin:${PATH}" \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    EFFECT_LEDGER_HOST=0.0.0.0 \
    EFFECT_LEDGER_PORT=8000

USER 10001:10001

EXPOSE 8000

# No HEALTHCHECK: Kubernetes probes /livez and /readyz (see k8s/base/deployment.yaml).
ENTRYPOINT ["effect-ledger"]
CMD ["serve"]
