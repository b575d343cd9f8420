"""Analyses over a policy's whole declared domain: outcomes, patterns, diff, table, lint, policy tests
and `check`."""
