"""The engine's version, at the bottom of the layers: the compiled-policy cache keys on it and
`hisparse --version` prints it, neither through the package's facade."""
__version__ = "0.1.0"
