import os
import tempfile

# as in tests/conftest.py: the policy cache of a test run lives in a temporary folder
os.environ.setdefault("HISPARSE_CACHE_DIR", tempfile.mkdtemp(prefix="hisparse-test-cache-"))
