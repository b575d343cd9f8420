"""hisparse-router policy engine (pure Python; never imports torch)."""
