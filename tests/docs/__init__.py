"""The docs' examples (issue 51): every runnable block of README.md and docs/ is a file under docs_src/
that a test here runs as a user would (docs/testing.md, "Docs examples")."""
