"""`selfspec serve`: an OpenAI-compatible HTTP server over one `SelfSpecModel` (`pip install "selfspec[serve]"`).

    selfspec serve path/to/model --heads path/to/heads --port 8000      # = python -m selfspec.serve ...

One concept per module: `config` (the settings), `request_body` (OpenAI request bodies -> checked requests),
`prompts` (their token ids and budget), `scheduler` (which job decodes when), `answer` (a job's events -> text with
OpenAI's stop strings, via `stop_text`), `response_body` (OpenAI response bodies and stream chunks), `errors`
(OpenAI's error body), `metrics` (Prometheus), `service` (the model's life: loading, ready, closing), `app` (the HTTP
routes), `server` (uvicorn and its shutdown). The command line is selfspec/cli.py's `serve`.

Requests decode one at a time (`scheduler.py` says why and what is to replace it): a request that arrives while
another decodes waits in a bounded queue, so the server's throughput is one request's.
"""
