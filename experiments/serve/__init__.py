"""servelab-serve: the real engine behind an OpenAI-compatible HTTP API (docs/serving.md).

cli.py (the command, Hydra config), app.py (routes, streaming), engine_client.py (the server's handle on
the engine process), engine_process.py (the engine process's loop), engine_loop.py (the engine in a thread
instead: serve.engine_process=false), delivery.py (a step's tokens to the requests and the metrics),
engine_info.py (what the routes know of the engine),
protocol.py (request bodies and their checks), text_stream.py (tokens to text, stop strings),
metrics.py (Prometheus), errors.py (OpenAI-style error bodies), config.py (the `serve:` options).
"""
