# Prometheus from Debian's package on the offline Debian base (scripts/build_stack_images.py).
ARG BASE
FROM ${BASE}
RUN apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus \
 && rm -rf /var/lib/apt/lists/* && mkdir -p /prometheus && chown prometheus:prometheus /prometheus
WORKDIR /prometheus
USER prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
