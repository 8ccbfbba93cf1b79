"""The stream rules both ends share: the middleware (``_asgi``) and the resuming transport (``_resume``).

``_rules`` (the resumable header, the media type of a response and whether it is an event stream,
graceful's own error object and how its final event is told, and how an OpenAI-style error object
says that the server failed or that the engine behind it has died) and ``_ends`` (how an
OpenAI-style stream ends: whole at ``data: [DONE]``, or early by the engine's abort or 5xx error
event; and the sequence number that a Responses stream's final event carries).

Imports no other graceful package.
"""
