# The image charts/effectq runs: `effectq worker`, `effectq reconciler`, `effectq api` and the
# operator verbs. tests/image builds it on a Debian bookworm base and runs it the way the
# chart does (uid 10001, read-only root, /tmp and the metrics directory as tmpfs).
#   docker build --build-arg VERSION=$(python -m setuptools_scm) \
#     --build-arg BASE=python:3.11-slim@sha256:<digest> -t REGISTRY/effectq:<VERSION> .
#   podman build --build-arg BASE=localhost/bookworm-python3 --build-arg VERSION=… .
# VERSION is the repository's (the tag: docs/release.md): the build context has no .git.
# BASE: any base with python3.11 -m venv; pin it by digest (docs/release.md).
ARG BASE=python:3.11-slim
FROM ${BASE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/effectq/bin:$PATH

# A builder behind a TLS-inspecting proxy or with a package mirror passes its pip settings
# (e.g. `-v /etc/ssl/certs:/certs:ro --build-arg PIP_CERT=/certs/ca-certificates.crt`); build
# arguments reach the RUN below as environment and are not kept in the image.
ARG PIP_CERT
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
# A venv of its own: Debian's python3 has no pip and refuses installs into the system
# (PEP 668), and the result is the same on python:3.11-slim.
WORKDIR /src
# Every distribution from the lock, each checked against its hashes (python -m
# tests.image.lock writes it; tests/image/test_lock.py holds it to pyproject). Its own
# layer: rebuilt only when the lock changes.
COPY image-requirements.txt ./
RUN python3 -m venv /opt/effectq \
    && /opt/effectq/bin/pip install --require-hashes --no-deps -r image-requirements.txt
# Then the project alone: no dependency resolved, no build backend fetched (it is in the
# lock), and pip check proves the lock held everything it needs.
ARG VERSION
COPY pyproject.toml README.md ./
COPY dedupe ./dedupe
COPY workers ./workers
COPY reconciler ./reconciler
RUN test -n "$VERSION" || { echo "build with --build-arg VERSION=X.Y.Z" >&2; exit 2; } \
    && SETUPTOOLS_SCM_PRETEND_VERSION_FOR_EFFECTQ="$VERSION" /opt/effectq/bin/pip install \
       --no-deps --no-build-isolation --no-index '.[fast,api]' \
    && /opt/effectq/bin/pip check \
    && rm -rf /src

# The chart runs the pod as this uid (podSecurityContext.runAsUser) on a read-only root
# filesystem, with /tmp and the metrics directory as emptyDir volumes.
RUN groupadd --gid 10001 effectq \
    && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin effectq
USER 10001:10001
WORKDIR /tmp
ENV HOME=/tmp

ENTRYPOINT ["effectq"]
CMD ["worker"]
