"""The people-facing layer: the HTTP API, the inbox page, tokens and metrics (``serve``).
Nothing in broker, producers or workers imports it."""
