# Redis from Debian's package on the offline Debian base (scripts/build_stack_images.py).
ARG BASE
FROM ${BASE}
RUN apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* && mkdir -p /data && chown redis:redis /data
WORKDIR /data
USER redis
EXPOSE 6379
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["redis-server", "--dir", "/data", "--appendonly", "yes"]
