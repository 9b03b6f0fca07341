"""What a vLLM says and is, read with its own rules: the ``vllm serve`` command line (argv), its
start-up log (log), its /metrics and acceptance figures (metrics, request_acceptance, curve), the
features a release has (features), and the probe that runs on the target's own python (probe).
Pure readers: the text comes from the callers, who hold the connections."""
