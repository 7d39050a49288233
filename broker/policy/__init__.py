"""Tenants' policies (docs/policies.md): ``rules.py`` a document checked, compiled, evaluated
(precedence) and explained; ``globs.py`` the globs and dotted payload paths its rules match
with; ``lanes.py`` where a run of a glob's atoms first occurs in a text, tested in C."""
