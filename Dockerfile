# webhook-poller: `poller` as the entrypoint, non-root, no build tools at run time.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml requirements-dev.lock README.md CHANGELOG.md alembic.ini ./
COPY poller ./poller
COPY db ./db
# At the versions the suite ran on (the lock pins the service's dependencies too).
RUN pip wheel --no-cache-dir --wheel-dir /wheels --constraint requirements-dev.lock \
    '.[server,otel]'  # the service, with OpenTelemetry export

FROM python:3.11-slim
RUN useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin poller
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links=/wheels 'webhook-poller[server,otel]' \
    && rm -rf /wheels
USER poller
ENV POLLER_LOG_FORMAT=json
EXPOSE 9108
ENTRYPOINT ["poller"]
CMD ["run"]
