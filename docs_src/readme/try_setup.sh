mkdir try-graceful && cd try-graceful
python3 -m venv .venv && . .venv/bin/activate
pip install ../graceful starlette     # ../graceful is the clone
