"""Policies and evaluations in words: conditions, operands and capabilities as phrases, and an
evaluation's trace events grouped into the steps explain, coverage and the lint read. The core
(engine/language, engine/policy) evaluates and reports events; it words nothing."""
