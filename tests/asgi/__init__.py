"""The middleware (graceful/_asgi): admission, probes, per-request accounting, lifespan, SIGTERM."""
