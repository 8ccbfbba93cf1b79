"""Resumable streams (graceful/_resume): the transports and the splicing rules."""
