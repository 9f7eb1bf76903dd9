"""What the CLI and the HTTP API share: submitting runs and batches, reading batch files, replay,
retention."""
