"""Helper apps the tests serve (under real servers, or in-process)."""
