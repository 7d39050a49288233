FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY broker broker
COPY workers workers
COPY producers producers
COPY pending_actions pending_actions
RUN pip install --no-cache-dir .
ENTRYPOINT ["pending-actions"]
