"""Every Redis read and write of run state: keys, the connection, the compare-and-set scripts, run
records, batches, cluster scans and the run index. No Celery, no HTTP, no threads."""
