"""errors: the machine-readable catalog of every error the package raises on purpose.

Work in progress: the JSON catalog, its validation against the code and the ``python -m errors``
command land here next.
"""
