"""graceful inside other programs that users already run.

``litellm`` (resume inside LiteLLM's proxy: ``litellm_settings: callbacks:
["graceful.integrations.litellm.handler"]``). Each module imports the program it plugs into, so import
it only there.
"""
