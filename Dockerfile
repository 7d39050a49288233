# The service image: `pending-actions` on PATH (worker, serve, mcp, mcp-proxy, up, stage, ...).
# Debian bookworm's Python 3.11, the same base .ci/docker-standins.sh builds where no image
# registry is reachable.
FROM python:3.11-slim-bookworm
# a venv: Debian's own python3 (the stand-in base) refuses a system-wide pip install (PEP 668)
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1
WORKDIR /app
# The extras of pyproject.toml installed beside the core: what a deployment runs (serve: the
# HTTP API, the inbox and /metrics; mcp: mcp, mcp-proxy and --mcp-upstream; otel: tracing;
# yaml: YAML policies). Others with --build-arg EXTRAS=serve,yaml; none with EXTRAS=
ARG EXTRAS=serve,mcp,otel,yaml
# dependencies first, in a layer that only a change of pyproject.toml or EXTRAS rebuilds; an
# extra pyproject.toml does not have fails the build naming it
COPY pyproject.toml README.md ./
RUN python3 -c "import sys, tomllib; \
project = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
extras = project['optional-dependencies']; \
wanted = [e.strip() for e in sys.argv[1].split(',') if e.strip()]; \
unknown = [e for e in wanted if e not in extras]; \
sys.exit(f'EXTRAS: no extra {unknown} in pyproject.toml (it has {sorted(extras)})') if unknown \
else print('\n'.join(project['dependencies'] + [r for e in wanted for r in extras[e]]))" \
        "$EXTRAS" > /tmp/requirements.txt \
    && pip install --no-cache-dir 'setuptools>=68' -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt
LABEL org.pending-actions.extras=$EXTRAS
# the service only (pyproject.toml maps the three folders into pending_actions); the harness
# (bench, soak, test clusters) stays out of the image
COPY broker broker
COPY workers workers
COPY producers producers
COPY pending_actions pending_actions
RUN pip install --no-cache-dir --no-deps --no-build-isolation . && rm -rf build *.egg-info
ENTRYPOINT ["pending-actions"]
