"""Reading files and streams safely: bounded, regular files only, UTF-8, positions kept; where the
shipped policy files are and which folder and policy a command uses by default; a document
checked against a shipped JSON Schema."""
