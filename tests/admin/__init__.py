"""The admin protocol (graceful/_admin): the listener and the client over a Unix socket."""
