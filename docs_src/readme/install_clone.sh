pip install ./graceful
