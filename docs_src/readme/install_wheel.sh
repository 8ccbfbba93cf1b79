pip wheel --no-deps --wheel-dir wheels ./graceful
pip install wheels/graceful_drain-*.whl
