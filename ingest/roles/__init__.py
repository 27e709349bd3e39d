"""A role that runs on one process at a time (the table committer, the compactor): its loop
(``runner``) and its health (``health``)."""
