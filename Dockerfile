# cronoq image: the server, the `cronoq` CLI, the operator and the example
# configuration, run as a non-root user. Build with `docker build -t cronoq .`
# Both stages use the same base, so the venv's interpreter link stays valid.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/cronoq
WORKDIR /src
COPY pyproject.toml setup.cfg setup.py MANIFEST.in README.md ./
COPY _build ./_build
COPY cronoq ./cronoq
COPY cronoq_compat ./cronoq_compat
COPY cronoq_pytest ./cronoq_pytest
# The server, the CLI, the PostgreSQL driver for stores with standbys, and the
# operator (deploy/helm/cronoq-operator runs this image as `cronoq-operator`).
RUN /opt/cronoq/bin/pip install ".[server,cli,postgres,operator]" \
 && /opt/cronoq/bin/pip uninstall -y pip setuptools \
 && /opt/cronoq/bin/python -m compileall -q /opt/cronoq/lib

FROM ${PYTHON_IMAGE}
# Bytecode was compiled in the builder: nothing is written at run time, so
# the root filesystem can be read-only.
ENV PATH=/opt/cronoq/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    CRONOQ_CONFIG=/etc/cronoq/cronoq.toml
COPY --from=builder /opt/cronoq /opt/cronoq
COPY deploy/cronoq.example.toml /etc/cronoq/cronoq.toml
# A numeric user, so runAsNonRoot can verify it without an /etc/passwd entry.
USER 10001:10001
EXPOSE 7070 7071
STOPSIGNAL SIGTERM
# Exec form: cronoq-server is PID 1 and receives SIGTERM itself.
ENTRYPOINT ["cronoq-server"]
