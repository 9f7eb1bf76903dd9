# Alertmanager from Debian's package (prometheus-alertmanager 0.25). docker-compose.yml builds it FROM
# debian:bookworm-slim; scripts/build_stack_images.py builds it on the offline Debian base (BASE).
ARG BASE=debian:bookworm-slim
FROM ${BASE}
RUN apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        prometheus-alertmanager tini \
 && rm -rf /var/lib/apt/lists/* && mkdir -p /alertmanager && chown prometheus:prometheus /alertmanager
WORKDIR /alertmanager
USER prometheus
EXPOSE 9093
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/bin/prometheus-alertmanager"]
# One replica: no HA gossip (an empty --cluster.listen-address turns clustering off).
CMD ["--config.file=/etc/alertmanager/alertmanager.yml", "--storage.path=/alertmanager", "--cluster.listen-address="]
