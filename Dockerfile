# The service image: `pending-actions` on PATH (worker, up, stage, resolve, stats, ...).
# Debian bookworm's Python 3.11, the same base .ci/docker-standins.sh builds where no image
# registry is reachable.
FROM python:3.11-slim-bookworm
# a venv: Debian's own python3 (the stand-in base) refuses a system-wide pip install (PEP 668)
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1
WORKDIR /app
# dependencies first, in a layer that only a change of pyproject.toml rebuilds
COPY pyproject.toml README.md ./
RUN python3 -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
    && pip install --no-cache-dir 'setuptools>=68' -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt
# the service only (pyproject.toml maps the three folders into pending_actions); the harness
# (bench, soak, test clusters) stays out of the image
COPY broker broker
COPY workers workers
COPY producers producers
COPY pending_actions pending_actions
RUN pip install --no-cache-dir --no-deps --no-build-isolation . && rm -rf build *.egg-info
ENTRYPOINT ["pending-actions"]
