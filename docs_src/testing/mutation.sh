bash scripts/mutation                           # a full run in a fresh mutants/: the score, then the survivors
bash scripts/mutation 'graceful._drain._run.*'  # rerun some mutants (names or globs), keeping the other results
bash scripts/mutation --keep                    # go on with an interrupted run
mutmut show NAME                                # the change one mutant makes (NAME: a mutant the run listed)
