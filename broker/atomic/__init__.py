"""Every atomic operation: one Lua file each under ``lua/``, whose header is the one
declaration of its name, flags, roles, KEYS and ARGV (``declared.py``); the text Redis runs
for each (``source.py``); one method per operation that passes its keys and arguments
(``scripts.py``), sent now or on a pipeline (``calls.py``); each reply as a type
(``replies.py``)."""
