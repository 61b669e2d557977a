# One image, every entry point: `unwind operator` (default), `unwind gateway`
# (the sidecar), `unwind undo-step` (rollback Jobs), and the CLI.
#
#   docker build -t unwind:0.1.0 .
#
# Needs BuildKit (the default builder since Docker 23) for the bind mount below.
ARG PYTHON_IMAGE=python:3.11-slim

# --- builder: wheels of the project and of every dependency ----------------
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# pyproject.toml names README.md as the long description, so the build needs it.
COPY pyproject.toml README.md ./
COPY operator/ operator/
RUN pip wheel --wheel-dir /wheels . \
    && ls /wheels/unwind_operator-*.whl

# --- final: the installed wheels, no compilers, no pip ---------------------
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="unwind" \
      org.opencontainers.image.description="Unwind operator, gateway sidecar and undo-step runner" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.1.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp
# Install from the builder's wheelhouse only (no index), then remove the
# packaging tools, and prove the entry point still starts.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels unwind-operator \
    && python -m pip uninstall -y setuptools wheel pip \
    && groupadd --gid 65532 unwind \
    && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
         --shell /usr/sbin/nologin unwind \
    && unwind --help >/dev/null
# Numeric user, so the kubelet can verify runAsNonRoot without reading /etc/passwd.
USER 65532:65532
WORKDIR /tmp
# 8080 kopf liveness, 9090 metrics, 8787 gateway (loopback inside the pod).
EXPOSE 8080 9090 8787
ENTRYPOINT ["unwind"]
CMD ["operator"]
