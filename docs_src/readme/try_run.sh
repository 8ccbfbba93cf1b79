graceful run myapp:app --port 8000
