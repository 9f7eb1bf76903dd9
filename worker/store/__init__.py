"""Every Redis read and write of reactq's state: keys, the connection, the compare-and-set scripts (`.lua`
beside their loaders), run records, a step's scratch, leases, the tool cache, once-only claims, new runs
and admission windows, batches, events, the reaper's scans, the run index, the purge's scans, tenant and
key records, tenant spend, event-stream slots, the provider limiter's cells, webhook deliveries, and the
API's asyncio reads. No Celery, no HTTP, no threads; it imports nothing above itself, so it takes and
gives plain values."""
