pip install -e '.[examples]'
python -m examples.server serve --port 8000 --load-delay 2s            # via `graceful run`
graceful run examples.server:app --port 8000                            # the same, configured from env
python -m examples.server drain --propagation-wait=10s                  # graceful's drain command, embedded

curl -N localhost:8000/v1/completions -H 'Idempotency-Key: k1' \
  -d '{"model": "graceful-example", "prompt": "hello", "max_tokens": 5, "stream": true}'
