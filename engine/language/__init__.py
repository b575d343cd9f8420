"""The policy language: inputs, schema, rules, conditions, templates, and turning a document into a
checked set of parts, a compiled evaluator and an interpreter, and the Decision both produce."""
