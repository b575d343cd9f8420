"""Serving: a policy store that reloads safely while it serves, and decision records with replay."""
