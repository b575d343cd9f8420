"""A loaded policy and its decisions: finding, loading, caching and evaluating policies."""
