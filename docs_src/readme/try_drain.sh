. try-graceful/.venv/bin/activate
graceful drain
curl -i -X POST localhost:8000/generate
