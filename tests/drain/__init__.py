"""The drain machine (graceful/_drain): states, ledger, runs, budget and options."""
