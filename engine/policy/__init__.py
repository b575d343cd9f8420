"""A loaded policy: finding, loading, caching and evaluating policies (memoised decisions)."""
