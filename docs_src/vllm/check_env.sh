python -c 'from graceful import GracefulMiddleware; GracefulMiddleware(lambda *asgi: None)'
