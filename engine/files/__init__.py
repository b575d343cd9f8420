"""Reading files and streams safely: bounded, regular files only, UTF-8, positions kept."""
