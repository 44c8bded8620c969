# applier in two images, from one wheel:
#
#   docker build -t applier .                       # target "slim" (the default): applier run
#   docker build -t applier:full --target full .    # + Java, pyspark, pg_dump: applier bootstrap
#
# "slim" has what `applier run`, status, decode, skip, drop, migrate and
# sync-sequences need (pip install pg-applier): no Java, no Spark, no PostgreSQL
# server or client programs. "full" adds the spark extra, a Java runtime and
# the PostgreSQL client programs (bootstrap copies the schema with pg_dump and
# loads it with psql; a newer pg_dump reads older servers, so the newest
# client, PG_CLIENT_MAJOR, comes from the PostgreSQL project's apt repository).
#
# Both run as the unprivileged user "applier" (uid 10001), read the config from
# $APPLIER_CONFIG (default /etc/applier/applier.toml: mount it there) and have a
# HEALTHCHECK that runs `applier status`: any non-zero status (1 a server
# unreachable, 3 stopped on an error, 4 no worker, 5 slot problem) is reported
# to Docker as 1, "unhealthy" (Docker reserves 2).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# -- the wheel ---------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS wheel
# A C compiler for the wheel's C speedups (hatch_build.py), in this stage only:
# the images get the compiled wheel, not the compiler.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md LICENSE hatch_build.py ./
COPY applier ./applier
COPY migrations ./migrations
# The units, the example config and the README ship in the wheel (share/).
COPY conf ./conf
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# -- what both images share ---------------------------------------------------------
FROM ${PYTHON_IMAGE} AS base
ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    APPLIER_CONFIG=/etc/applier/applier.toml \
    STATE_DIRECTORY=/var/lib/applier
# The spool's private state directory is the user's home (Spark's caches too).
RUN groupadd --system --gid 10001 applier \
 && useradd --system --uid 10001 --gid applier --home-dir /var/lib/applier \
        --no-create-home --shell /usr/sbin/nologin applier \
 && install -d -m 0700 -o applier -g applier /var/lib/applier \
 && install -d -m 0755 /etc/applier
WORKDIR /var/lib/applier
# Started after the worker has had time to connect and write its first heartbeat.
HEALTHCHECK --interval=30s --timeout=20s --start-period=60s --retries=3 \
    CMD ["sh", "-c", "applier status --config \"$APPLIER_CONFIG\" || exit 1"]
ENTRYPOINT ["applier"]

# -- full: bootstrap (and everything slim does) -------------------------------------
FROM base AS full
ARG PG_CLIENT_MAJOR=18
# The man directory: Debian's JRE package fails to install without it in slim images;
# procps: Spark's launcher scripts call ps.
# Unpinned apt packages: the base image's Debian release pins them, and a rebuild
# should get its security updates.
# hadolint ignore=DL3008
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl openjdk-17-jre-headless procps \
 && install -d /usr/share/postgresql-common/pgdg \
 && curl -fsSL -o /usr/share/postgresql-common/pgdg/apt.postgresql.org.asc \
        https://www.postgresql.org/media/keys/ACCC4CF8.asc \
 && . /etc/os-release \
 && echo "deb [signed-by=/usr/share/postgresql-common/pgdg/apt.postgresql.org.asc] https://apt.postgresql.org/pub/repos/apt ${VERSION_CODENAME}-pgdg main" \
        > /etc/apt/sources.list.d/pgdg.list \
 && apt-get update \
 && apt-get install -y --no-install-recommends "postgresql-client-${PG_CLIENT_MAJOR}" \
 && apt-get purge -y --auto-remove curl \
 && rm -rf /var/lib/apt/lists/*
COPY --from=wheel /wheels /tmp/wheels
# The wheel's own dependency ranges (pyproject.toml) bound what pip installs.
# hadolint ignore=DL3013
RUN set -- /tmp/wheels/pg_applier-*.whl \
 && pip install --no-cache-dir "$1[spark]" \
 && rm -rf /tmp/wheels
# Spark's Python workers import applier: the same interpreter as the driver.
ENV PYSPARK_PYTHON=/usr/local/bin/python
USER 10001:10001
CMD ["bootstrap", "--config", "/etc/applier/applier.toml", "--quiet"]

# -- slim: applier run (the default target, so it comes last) -----------------------
FROM base AS slim
COPY --from=wheel /wheels /tmp/wheels
# hadolint ignore=DL3013
RUN pip install --no-cache-dir /tmp/wheels/pg_applier-*.whl \
 && rm -rf /tmp/wheels
USER 10001:10001
CMD ["run", "--config", "/etc/applier/applier.toml"]
