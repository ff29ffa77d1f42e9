"""Relay's v1 workflow dialect: the YAML loader (tags, positions), the expression language,
the function library, the evaluator and the validator. Semantics follow relay-core at
cdb56ed33218 (pkg/expr, pkg/workflow/types/v1); where this package is stricter, docs/workflows.md
says so."""
