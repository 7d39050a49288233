"""The agent's own tools over the Model Context Protocol: ``pending-actions mcp`` serves
``resolve`` and ``pending``; ``pending-actions mcp-proxy`` serves another MCP server's tools and
stages the calls that would change something (docs/mcp.md). Needs the ``mcp`` extra, which only
the modules that talk MCP import (``upstreams`` does not, nor the commands, ``cli/mcp.py``)."""
