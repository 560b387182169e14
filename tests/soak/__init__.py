"""The chaos soak (`make soak`): small jobs on the local cluster while a seeded driver breaks
things under them (docs/scheduling.md, "Chaos soak")."""
