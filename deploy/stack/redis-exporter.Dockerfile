# The Redis exporter from Debian's package (prometheus-redis-exporter 1.45). docker-compose.yml builds it
# FROM debian:bookworm-slim; scripts/build_stack_images.py builds it on the offline Debian base (BASE).
# Configured by environment: REDIS_ADDR, REDIS_USER, REDIS_PASSWORD (the `exporter` ACL user).
ARG BASE=debian:bookworm-slim
FROM ${BASE}
RUN apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        prometheus-redis-exporter tini \
 && rm -rf /var/lib/apt/lists/*
USER prometheus
EXPOSE 9121
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/bin/prometheus-redis-exporter"]
CMD ["-web.listen-address=:9121"]
