# applier with Spark (Java runtime) for bootstrap; runs `applier run` by default.
FROM python:3.11-slim-bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless postgresql-client \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/applier
COPY pyproject.toml README.md ./
COPY applier ./applier
COPY migrations ./migrations
RUN pip install --no-cache-dir ".[spark]"
ENV PYSPARK_PYTHON=/usr/local/bin/python
# The spool's private state directory (nobody has no home to default to).
RUN mkdir -m 0700 /var/lib/applier && chown nobody /var/lib/applier
ENV STATE_DIRECTORY=/var/lib/applier
USER nobody
ENTRYPOINT ["applier"]
CMD ["--help"]
