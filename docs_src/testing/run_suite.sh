bash scripts/test            # sets up what the tests need, runs pytest under coverage, fails under 95%
bash scripts/test -x -k run  # arguments go to pytest
