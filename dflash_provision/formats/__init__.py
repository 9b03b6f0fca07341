"""Pure parsers of the formats a drafter's files come in: JSON read strictly (bounded nesting,
finite numbers, no duplicate keys) and the safetensors header; how a place in a JSON document is
written (json_path); the Prometheus text format written (prometheus_text). No I/O: bytes in,
values or a one-line error out; values in, text out."""
