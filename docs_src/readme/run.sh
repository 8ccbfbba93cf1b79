graceful run myapp:app --host 0.0.0.0 --port 8000 --grace-period 90 --propagation-wait 10s
