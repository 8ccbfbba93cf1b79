graceful run app:app --handoff-streams        # or GRACEFUL_HANDOFF_STREAMS=1
