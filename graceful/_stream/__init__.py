"""The stream rules both ends share: the middleware (``_asgi``) and the resuming transport (``_resume``).

``_rules`` (the resumable header, the media type of a response, and how an OpenAI-style error
object says that the server failed or that the engine behind it has died).

Imports no other graceful package.
"""
