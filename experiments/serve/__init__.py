"""servelab-serve: the real engine behind an OpenAI-compatible HTTP API (docs/serving.md).

cli.py (the command, Hydra config), app.py (routes, streaming), engine_loop.py (the engine thread),
protocol.py (request bodies and their checks), text_stream.py (tokens to text, stop strings),
metrics.py (Prometheus), errors.py (OpenAI-style error bodies), config.py (the `serve:` options).
"""
