"""Ways to run commands and move files on a node: ``local`` and ``ssh``."""
