# The image charts/effectq runs: `effectq worker`, `effectq reconciler` and the operator
# verbs. Minimal, and not built by this repository's CI (no container engine there).
#   docker build -t REGISTRY/effectq:0.1.0 .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY dedupe ./dedupe
COPY workers ./workers
COPY reconciler ./reconciler
RUN pip install '.[fast]' && rm -rf /src

# The chart runs the pod as this uid (podSecurityContext.runAsUser) on a read-only root
# filesystem, with /tmp and the metrics directory as emptyDir volumes.
RUN groupadd --gid 10001 effectq \
    && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin effectq
USER 10001:10001
WORKDIR /tmp
ENV HOME=/tmp

ENTRYPOINT ["effectq"]
CMD ["worker"]
