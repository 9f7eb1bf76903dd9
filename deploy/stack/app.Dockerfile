# The reactq image (API, step and sandbox workers, api_stub) on the offline Debian base.
# Built by scripts/build_stack_images.py with no registry. The context holds `wheels/` (the dependencies,
# built on the host by its pip), `app/` (the reactq wheel) and `ca.crt` (the host's CA bundle, for the
# few wheels the image's Python 3.11.2 needs beyond the host's resolution, fetched from PyPI).
ARG BASE
FROM ${BASE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    REACTQ_METRICS_PORT=9808 PATH=/opt/reactq/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# Dependencies first, in their own layer: it is reused while pyproject.toml's dependencies are unchanged.
COPY wheels /tmp/wheels
# constraints.txt: deploy/constraints.txt, the versions the test suite passed with.
COPY ca.crt requirements.txt constraints.txt /tmp/
RUN useradd --system --uid 10001 --home-dir /app --create-home reactq \
 && python3 -m venv /opt/reactq \
 && PIP_CERT=/tmp/ca.crt /opt/reactq/bin/pip install -q --find-links /tmp/wheels -r /tmp/requirements.txt -c /tmp/constraints.txt \
 && rm -rf /tmp/wheels /tmp/ca.crt /tmp/requirements.txt /tmp/constraints.txt
COPY app /tmp/app
RUN /opt/reactq/bin/pip install -q --no-index --no-deps /tmp/app/*.whl && rm -rf /tmp/app
WORKDIR /app
USER 10001
EXPOSE 8000 8900 9808
# tini reaps children and forwards SIGTERM, so Celery gets its warm shutdown.
ENTRYPOINT ["/usr/bin/tini", "--", "reactq"]
CMD ["--help"]
